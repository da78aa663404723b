"""Speculative decoding on hybrid models (recurrent layers beside attention): the tiny LFM2 (short
convolutions), Qwen3.5 and Qwen3-Next (Gated DeltaNet) and Granite 4 hybrid (Mamba-2). A
verifying step reads every draft through the recurrent layers, whose states cannot forget
tokens as a paged KV cache does; after it each sequence's states must be those after the
drafts it kept. So greedy output with drafts is token for token the output without, however
many drafts each step keeps, in a batch, through preemption and from prefix-cache checkpoints.

Random tiny models seldom continue their prompts, so prompt lookup's drafts would seldom be
kept: these tests draft from the reply the model gives without speculation, with one draft of
each proposal wrong at a position that changes from step to step (`ScriptedDrafts`), so steps
keep anywhere from none to all of their drafts.
"""

from __future__ import annotations

import pytest
import transformers

from pagoda.engine import LLM, SamplingParams
from pagoda.engine.spec_decode.ngram_proposer import NgramProposer
from tests.engine.models.test_parity import NUM_THREADS
from tests.engine.test_batch_invariance import SENTENCES
from tests.engine.tiny_models import save_tiny_model

HYBRIDS = ("lfm2", "qwen3.5", "qwen3-next", "granite-hybrid")
K = 4
GREEDY = SamplingParams(temperature=0, max_tokens=40, ignore_eos=True)
SPEC = {"num_speculative_tokens": K, "speculative_cost_model": False,
        "num_threads": NUM_THREADS}


class ScriptedDrafts(NgramProposer):
    """Proposes the next tokens of each prompt's known greedy reply, the one at index
    (tokens so far) % (K + 1) of each proposal replaced by another token (none when that index
    is K), so the drafts kept go 0, 1, ..., K as a reply grows; without `mistakes`, every
    draft is right."""

    def __init__(self, replies: dict[tuple[int, ...], list[int]], vocab_size: int,
                 mistakes: bool = True) -> None:
        super().__init__(K, 1, 1)
        self.replies = replies
        self.vocab_size = vocab_size
        self.mistakes = mistakes

    def propose(self, seq, max_drafts: int) -> list[int]:
        done = len(seq.output_token_ids)
        reply = self.replies[tuple(seq.prompt_token_ids)]
        drafts = reply[done:done + min(max_drafts, K)]
        wrong = done % (K + 1)
        if self.mistakes and wrong < len(drafts):
            drafts[wrong] = (drafts[wrong] + 1) % self.vocab_size
        return drafts


@pytest.fixture(scope="module", params=HYBRIDS)
def hybrid(request, tmp_path_factory):
    return save_tiny_model(tmp_path_factory.mktemp(request.param), request.param)


@pytest.fixture(scope="module")
def prompts(hybrid) -> list[list[int]]:
    """Four prompts of 21 to 130 tokens that share no prefix."""
    tokenizer = transformers.AutoTokenizer.from_pretrained(hybrid)
    ids = [tokenizer.encode(f"Note {i}. " + " ".join(SENTENCES[i:] + SENTENCES[:i]))
           for i in range(4)]
    return [p[:n] for p, n in zip(ids, (130, 21, 77, 100), strict=True)]


def replies(llm: LLM, prompts: list[list[int]], params: SamplingParams = GREEDY
            ) -> list[list[int]]:
    return [list(out.outputs[0].token_ids) for out in llm.generate(prompts, params)]


@pytest.fixture(scope="module")
def reference(hybrid, prompts) -> list[list[int]]:
    """Each prompt's greedy reply without speculation (and without the prefix cache)."""
    llm = LLM(str(hybrid), num_threads=NUM_THREADS, num_kv_blocks=64,
              enable_prefix_caching=False)
    return replies(llm, prompts)


def speculating(hybrid, prompts, reference, mistakes: bool = True, **settings) -> LLM:
    llm = LLM(str(hybrid), **(SPEC | {"num_kv_blocks": 64} | settings))
    scripted = {tuple(p): r for p, r in zip(prompts, reference, strict=True)}
    llm.engine.scheduler.proposer = ScriptedDrafts(scripted, llm.engine.runner.vocab_size,
                                                   mistakes)
    return llm


def assert_drafts_kept_and_rejected(llm: LLM) -> None:
    stats = llm.stats()
    assert 0 < stats.spec_accepted_tokens < stats.spec_draft_tokens


def assert_nothing_held(llm: LLM) -> None:
    engine = llm.engine
    assert engine.state_pool.num_free_slots == engine.state_pool.num_slots
    assert engine.kv_cache.checkpoints.num_held == 0


def test_greedy_reply_alone_is_identical_with_drafts_kept_and_rejected(hybrid, prompts,
                                                                       reference):
    llm = speculating(hybrid, prompts, reference)
    for prompt, want in zip(prompts, reference, strict=True):
        assert replies(llm, [prompt]) == [want]
    assert_drafts_kept_and_rejected(llm)
    assert_nothing_held(llm)


def test_greedy_batch_is_identical_with_drafts_kept_and_rejected(hybrid, prompts, reference):
    llm = speculating(hybrid, prompts, reference)
    assert replies(llm, prompts) == reference
    assert_drafts_kept_and_rejected(llm)
    assert_nothing_held(llm)


def test_preempted_speculating_requests_resume_with_identical_tokens(hybrid, prompts,
                                                                     reference):
    """12 blocks of 16 tokens hold the longest request (170 tokens) but not all four: the
    newest are preempted and restart from a checkpoint or their first token."""
    llm = speculating(hybrid, prompts, reference, num_kv_blocks=12)
    assert replies(llm, prompts) == reference
    assert llm.stats().num_preemptions > 0
    assert_drafts_kept_and_rejected(llm)
    assert_nothing_held(llm)


def test_a_second_turn_starts_from_a_checkpoint_taken_while_speculating(hybrid, prompts,
                                                                        reference):
    """The first turn (21 prompt tokens) keeps all 4 drafts of every step: its decodes end at
    22, 27, 32, ...; the one that reaches the block boundary at 32 checkpoints the states there
    and reads no drafts (the copy would hold states past them), then 33, 38, 43, 48 likewise.
    The second turn starts from the reply's latest checkpoint and replies as a cold engine
    does."""
    llm = speculating(hybrid, prompts, reference, mistakes=False)
    first = prompts[1]
    assert replies(llm, [first]) == [reference[1]]
    second = first + reference[1] + prompts[2]
    cold = LLM(str(hybrid), num_threads=NUM_THREADS, num_kv_blocks=64,
               enable_prefix_caching=False)
    want = replies(cold, [second])[0]
    llm.engine.scheduler.proposer.replies[tuple(second)] = want
    out = llm.generate([second], GREEDY)[0]
    assert out.num_cached_tokens == 48  # the reply's checkpoint, not the prompt's at 16
    assert list(out.outputs[0].token_ids) == want
    assert_nothing_held(llm)


def test_prompt_lookup_is_on_for_a_hybrid_model(hybrid, prompts, reference):
    """The engine's own drafter is no longer turned off for these models (the random replies
    seldom repeat a token of their context, so it seldom finds anything to propose)."""
    llm = LLM(str(hybrid), **(SPEC | {"num_kv_blocks": 64}))
    assert isinstance(llm.engine.scheduler.proposer, NgramProposer)
    assert replies(llm, prompts) == reference
