"""What every hybrid family's tests check (LFM2, Granite 4 hybrid, Qwen3.5): its recurrent
states, in a slot per sequence, give each request the tokens it gets alone whatever the prefill
chunk, the batch or a preemption, and every slot comes back when requests end or are aborted."""

from __future__ import annotations

from pathlib import Path

import torch
import transformers

from pagoda.engine import LLM, SamplingParams
from tests.engine.models.test_parity import NUM_THREADS
from tests.engine.test_batch_invariance import SENTENCES

GREEDY = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)
# The same, with each token's logprob: a reply compared to fp32 rounding (`assert_same_reply`).
GREEDY_LOGPROBS = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True, logprobs=0)
# The long prompts' lengths: 22 blocks of 16 tokens hold the longest with its reply (324 tokens)
# but not all of them at once.
LONG_PROMPT_TOKENS = (300, 20, 150, 64, 97)
PREEMPTING_KV_BLOCKS = 22


def long_prompts(folder: Path) -> list[list[int]]:
    """Prompts of 20 to 300 tokens that share no prefix."""
    tokenizer = transformers.AutoTokenizer.from_pretrained(folder)
    ids = [tokenizer.encode(f"Note {i}. " + " ".join(SENTENCES[i:] + SENTENCES[:i]) * 2)
           for i in range(len(LONG_PROMPT_TOKENS))]
    return [p[:n] for p, n in zip(ids, LONG_PROMPT_TOKENS, strict=True)]


def greedy_tokens(llm: LLM, prompts: list[list[int]]) -> list[list[int]]:
    return [out.outputs[0].token_ids for out in llm.generate(prompts, GREEDY)]


def tokens_alone(folder: Path, prompts: list[list[int]]) -> list[list[int]]:
    """Each prompt's greedy tokens, run alone in one prefill."""
    llm = LLM(str(folder), num_threads=NUM_THREADS, num_kv_blocks=64)
    return [greedy_tokens(llm, [p])[0] for p in prompts]


def assert_all_slots_free(llm: LLM) -> None:
    pool = llm.engine.state_pool
    assert pool.num_free_slots == pool.num_slots


def assert_chunks_keep_the_tokens(folder: Path, prompts: list[list[int]],
                                  alone: list[list[int]]) -> None:
    """7-token chunks (prime, so chunks end anywhere in a convolution's window or a scan's
    chunk), the prompts batched with each other's chunks and decodes."""
    llm = LLM(str(folder), num_threads=NUM_THREADS, num_kv_blocks=64, max_num_batched_tokens=7)
    assert greedy_tokens(llm, prompts) == alone


def assert_the_batch_keeps_the_tokens(folder: Path, prompts: list[list[int]],
                                      alone: list[list[int]]) -> None:
    llm = LLM(str(folder), num_threads=NUM_THREADS, num_kv_blocks=64)
    assert greedy_tokens(llm, prompts) == alone
    assert_all_slots_free(llm)


def assert_preemption_keeps_the_tokens(folder: Path, prompts: list[list[int]],
                                       alone: list[list[int]]) -> None:
    """The newest requests are preempted, lose their states with their slot, and recompute
    from their first token."""
    llm = LLM(str(folder), num_threads=NUM_THREADS, num_kv_blocks=PREEMPTING_KV_BLOCKS)
    assert greedy_tokens(llm, prompts) == alone
    assert llm.stats().num_preemptions > 0
    assert_all_slots_free(llm)


def assert_aborts_give_the_slots_back(folder: Path, prompts: list[list[int]]) -> None:
    llm = LLM(str(folder), num_threads=NUM_THREADS, num_kv_blocks=64, max_num_batched_tokens=32)
    engine = llm.engine
    for i, prompt in enumerate(prompts[:3]):
        engine.add_request(str(i), prompt, GREEDY)
    engine.step()
    engine.step()
    assert engine.state_pool.num_free_slots < engine.state_pool.num_slots
    for i in range(3):
        engine.abort_request(str(i))
    assert_all_slots_free(llm)
    assert not engine.has_unfinished_requests()


def reply(llm: LLM, prompt: list[int]):
    return llm.generate([prompt], GREEDY_LOGPROBS)[0]


def assert_same_reply(got, want) -> None:
    """The same greedy tokens, with the same logprobs to fp32 rounding."""
    assert got.outputs[0].token_ids == want.outputs[0].token_ids
    torch.testing.assert_close(_logprobs(got), _logprobs(want), atol=1e-4, rtol=0)


def _logprobs(out) -> torch.Tensor:
    return torch.tensor([entry.chosen.logprob for entry in out.outputs[0].logprobs])
