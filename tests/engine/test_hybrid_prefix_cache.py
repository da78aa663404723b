"""Prefix caching on a hybrid model (the tiny LFM2: short convolutions beside attention), whose
recurrent states are kept at block boundaries: a chat's second turn, a shared system prompt
and a preempted request start from a checkpoint, and every greedy reply is the one a cold
engine (prefix cache off) gives.

Blocks of 16 tokens (the default).
"""

import pytest
import torch
import transformers

from pagoda.engine import LLM
from pagoda.engine.core.sequence import Sequence
from tests.engine.hybrid_checks import GREEDY_LOGPROBS, assert_same_reply, reply
from tests.engine.models.test_parity import NUM_THREADS
from tests.engine.test_batch_invariance import SENTENCES
from tests.engine.tiny_models import save_tiny_model

# The sampled tokens' logprobs too: a reply's tokens can survive a slightly wrong state.
BLOCK = 16


@pytest.fixture(scope="module")
def lfm2(tmp_path_factory):
    return save_tiny_model(tmp_path_factory.mktemp("lfm2"), "lfm2")


@pytest.fixture(scope="module")
def texts(lfm2) -> list[list[int]]:
    """Five token runs of 300 that share no prefix."""
    tokenizer = transformers.AutoTokenizer.from_pretrained(lfm2)
    ids = [tokenizer.encode(f"Note {i}. " + " ".join(SENTENCES[i:] + SENTENCES[:i]) * 2)
           for i in range(5)]
    return [p[:300] for p in ids]


@pytest.fixture(scope="module")
def cold(lfm2):
    """An engine with the prefix cache off: every prompt computed from its first token."""
    return LLM(str(lfm2), num_threads=NUM_THREADS, num_kv_blocks=64,
               enable_prefix_caching=False)


def engine(lfm2, **settings) -> LLM:
    return LLM(str(lfm2), num_threads=NUM_THREADS, **({"num_kv_blocks": 64} | settings))


def assert_nothing_held(llm: LLM) -> None:
    e = llm.engine
    assert e.state_pool.num_free_slots == e.state_pool.num_slots
    assert e.kv_cache.checkpoints.num_held == 0
    assert e.kv_cache.checkpoints.num_cached <= e.kv_cache.checkpoints.num_slots


def test_a_second_turn_starts_within_a_block_of_the_first_turns_end(lfm2, texts, cold):
    """The first turn's 150 prompt tokens and 24 replies (173 computed: the last reply is
    sampled, never fed back) are checkpointed at 160; the second turn, which repeats them and
    adds a message, starts there."""
    llm = engine(lfm2)
    prompt = texts[0][:150]
    first = reply(llm, prompt)
    turn = prompt + list(first.outputs[0].token_ids)
    second_prompt = turn + texts[1][:20]
    second = reply(llm, second_prompt)
    assert second.num_cached_tokens >= len(turn) - BLOCK
    assert second.num_cached_tokens == 160
    assert_same_reply(second, reply(cold, second_prompt))
    assert_nothing_held(llm)


def test_a_second_turn_whose_reply_is_rendered_otherwise_falls_back_to_the_prompts_end(
        lfm2, texts, cold):
    """The template re-renders the reply differently (here: its first token): the blocks
    after the first prompt's last boundary no longer match, and the prompt-end checkpoint
    (at 144 of 150) is where the second turn starts."""
    llm = engine(lfm2)
    prompt = texts[0][:150]
    first = reply(llm, prompt)
    rendered = [texts[2][0]] + list(first.outputs[0].token_ids)[1:]
    second_prompt = prompt + rendered + texts[1][:20]
    second = reply(llm, second_prompt)
    assert second.num_cached_tokens == 144
    assert_same_reply(second, reply(cold, second_prompt))


def test_a_shared_system_prompt_is_found_at_the_first_questions_prompt_end(lfm2, texts, cold):
    """A 100-token system prompt and two short questions: the first prompt (106 tokens) is
    checkpointed at 96, inside the system prompt, where the second question starts."""
    llm = engine(lfm2)
    system = texts[3][:100]
    questions = [texts[4][:6], texts[2][:9]]
    replies = [reply(llm, system + q) for q in questions]
    assert replies[1].num_cached_tokens == 96
    for got, q in zip(replies, questions, strict=True):
        assert_same_reply(got, reply(cold, system + q))


def test_preempted_requests_resume_from_their_checkpoints_with_the_same_tokens(
        lfm2, texts, cold, monkeypatch):
    """22 blocks hold the longest request but not all five at once: the newest are preempted,
    and resume from a checkpoint of their own (prompt end or latest boundary) where its blocks
    are still cached; the prompts share no prefix, so every restore is such a resume."""
    prompts = [p[:n] for p, n in zip(texts, (300, 20, 150, 64, 97), strict=True)]
    want = [reply(cold, p) for p in prompts]
    llm = engine(lfm2, num_kv_blocks=22)
    runner, restores = llm.engine.runner, []
    copy_states = runner.copy_states

    def counting_copies(copies):
        restores.extend(c for c in copies if c[0] >= runner.num_state_slots)
        copy_states(copies)

    monkeypatch.setattr(runner, "copy_states", counting_copies)
    for got, alone in zip(llm.generate(prompts, GREEDY_LOGPROBS), want, strict=True):
        assert_same_reply(got, alone)
    assert llm.stats().num_preemptions > 0
    assert restores, "no preempted request resumed from a checkpoint"
    assert_nothing_held(llm)


def test_an_aborted_request_gives_its_slot_back_and_keeps_its_checkpoints(lfm2, texts):
    llm = engine(lfm2, max_num_batched_tokens=32)
    e = llm.engine
    for i, prompt in enumerate(texts[:3]):
        e.add_request(str(i), prompt[:100], GREEDY_LOGPROBS)
    for _ in range(8):
        e.step()
    assert e.kv_cache.checkpoints.num_cached + e.kv_cache.checkpoints.num_held > 0
    for i in range(3):
        e.abort_request(str(i))
    assert not e.has_unfinished_requests()
    assert_nothing_held(llm)


def test_a_chunked_prompt_is_checkpointed_at_the_same_boundary_with_the_same_states(
        lfm2, texts, cold):
    """7-token chunks end anywhere; the one that would pass the prompt's last boundary (288 of
    300) ends there, and the states copied out are the one-chunk prefill's."""
    prompt = texts[0]
    want = reply(cold, prompt)
    states = []
    for budget in (7, 512):
        llm = engine(lfm2, max_num_batched_tokens=budget)
        assert_same_reply(reply(llm, prompt), want)
        e = llm.engine
        again = reply(llm, prompt)
        assert again.num_cached_tokens == 288
        assert_same_reply(again, want)
        slot = _prompt_end_slot(e, prompt)
        states.append([s[slot].clone() for layer in e.runner.recurrent_states
                       for s in layer or ()])
    for chunked, whole in zip(*states, strict=True):
        torch.testing.assert_close(chunked, whole, atol=1e-5, rtol=1e-5)


def _prompt_end_slot(e, prompt: list[int]) -> int:
    """The checkpoint slot cached at the prompt's last boundary."""
    seq = Sequence("probe", prompt, GREEDY_LOGPROBS, frozenset())
    slot = e.kv_cache.checkpoints.find(e.kv_cache.block_hash(seq, len(prompt) // BLOCK - 1))
    assert slot is not None
    return slot
