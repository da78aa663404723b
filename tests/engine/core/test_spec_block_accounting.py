"""Speculation never corrupts the KV cache's bookkeeping.

The real Scheduler, KVCacheManager and NgramProposer run with verification outcomes made up by
hypothesis, and a fake model that records which token's key and value each cache slot holds. After
every step: block accounting is exact, a running sequence holds blocks for its computed tokens and
no more, and every computed position and every block in the prefix cache holds the tokens of the
sequence, never a rejected draft's.
"""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from pagoda.engine.config import SchedulerConfig
from pagoda.engine.core.kv_cache_manager import KVCacheManager
from pagoda.engine.core.scheduler import Scheduler, SchedulerOutput
from pagoda.engine.core.sequence import Sequence
from pagoda.engine.sampling.params import SamplingParams
from pagoda.engine.spec_decode.ngram_proposer import NgramProposer
from pagoda.engine.spec_decode.step_cost import StepCost
from tests.engine.core.test_scheduler import BLOCK_SIZE, EOS, check_invariants

# A small alphabet, so the context repeats and the proposer drafts often.
PREFIXES = [[1, 2, 3, 1, 2, 3, 1, 2], [1, 2, 3, 4, 1, 2], [5, 6, 5, 6, 5, 6, 5, 6, 5]]


def make_scheduler(num_blocks: int, budget: int, num_spec: int) -> Scheduler:
    kv = KVCacheManager(num_blocks, BLOCK_SIZE, enable_prefix_caching=True)
    return Scheduler(SchedulerConfig(4, budget, max_model_len=64), kv,
                     NgramProposer(num_spec, 1, 3))


def prompt_seq(request_id: str, prompt: list[int], max_tokens: int) -> Sequence:
    return Sequence(request_id, prompt, SamplingParams(max_tokens=max_tokens), frozenset({EOS}))


class FakeModel:
    """Writes each scheduled token into its slot, as the model runner does with keys/values."""

    def __init__(self) -> None:
        self.slots: dict[int, int] = {}

    def run(self, out: SchedulerOutput) -> None:
        for item in out.scheduled:
            seq, start = item.seq, item.num_computed_tokens
            end = start + item.num_new_tokens
            tokens = seq.all_token_ids[start:end - len(item.spec_token_ids)] + item.spec_token_ids
            for pos, token in zip(range(start, end), tokens, strict=True):
                self.slots[seq.block_ids[pos // BLOCK_SIZE] * BLOCK_SIZE + pos % BLOCK_SIZE] = token

    def block_tokens(self, block_id: int) -> tuple[int | None, ...]:
        return tuple(self.slots.get(block_id * BLOCK_SIZE + i) for i in range(BLOCK_SIZE))


def check_kv_holds_only_sequence_tokens(sched: Scheduler, model: FakeModel) -> None:
    for seq in sched.running:
        assert len(seq.block_ids) == -(-seq.num_computed_tokens // BLOCK_SIZE), (
            "a running sequence holds blocks past its computed tokens")
        assert seq.num_computed_tokens < seq.num_tokens
        for pos in range(seq.num_computed_tokens):
            slot = seq.block_ids[pos // BLOCK_SIZE] * BLOCK_SIZE + pos % BLOCK_SIZE
            assert model.slots[slot] == seq.all_token_ids[pos], "computed KV of a wrong token"
    for block in sched.kv_cache.pool._cached.values():
        assert model.block_tokens(block.block_id) == block.token_ids, "a cached block's KV differs"


def step(sched: Scheduler, model: FakeModel, outcomes: list[tuple[int, int]]) -> None:
    out = sched.schedule()
    model.run(out)
    sampled = []
    for item in out.scheduled:
        accepted, token = outcomes.pop() if outcomes else (0, EOS)
        if item.spec_token_ids:
            drafts = item.spec_token_ids
            sampled.append(drafts[:min(accepted, len(drafts))] + [token])
        else:
            sampled.append([token] if item.samples else [])
    sched.update_from_output(out, sampled)


outcome = st.tuples(st.integers(0, 4), st.integers(0, 7))
ops = st.lists(
    st.one_of(
        st.tuples(st.just("add"), st.integers(0, len(PREFIXES) - 1),
                  st.lists(st.integers(1, 7), max_size=6), st.integers(1, 16)),
        st.tuples(st.just("step"), st.lists(outcome, min_size=4, max_size=8)),
        st.tuples(st.just("abort"), st.integers(0, 30)),
    ),
    max_size=60,
)


@settings(max_examples=300, deadline=None)
@given(ops=ops, num_blocks=st.integers(6, 24), budget=st.integers(1, 24),
       num_spec=st.integers(1, 4))
def test_rollback_of_rejected_drafts_keeps_block_accounting_exact(ops, num_blocks, budget,
                                                                  num_spec):
    sched = make_scheduler(num_blocks, budget, num_spec)
    kv = sched.kv_cache
    model = FakeModel()
    seqs: list[Sequence] = []
    for op in ops:
        if op[0] == "add":
            _, prefix, suffix, max_tokens = op
            seq = Sequence(f"r{len(seqs)}", PREFIXES[prefix] + suffix,
                           SamplingParams(temperature=0, max_tokens=max_tokens), frozenset({EOS}))
            seqs.append(seq)
            sched.add(seq)
        elif op[0] == "step":
            step(sched, model, list(op[1]))
        elif seqs:
            sched.finish(seqs[op[1] % len(seqs)], "abort")
        check_invariants(sched)
        check_kv_holds_only_sequence_tokens(sched, model)
    for _ in range(2000):
        if not (sched.waiting or sched.running):
            break
        step(sched, model, [(2, 3)])
        check_invariants(sched)
        check_kv_holds_only_sequence_tokens(sched, model)
    assert not (sched.waiting or sched.running), "requests never finished"
    assert kv.pool.num_free_blocks == kv.pool.num_blocks
    assert not sched.proposer._states, "the proposer kept state of finished sequences"
    for seq in seqs:
        if seq.finish_reason != "abort":
            assert seq.num_output_tokens <= seq.params.max_tokens


def test_a_sequence_drafts_after_its_prompt_and_keeps_what_was_accepted():
    sched = make_scheduler(16, 32, 3)
    seq = prompt_seq("a", [1, 2, 3, 1, 2, 3, 1], max_tokens=10)
    sched.add(seq)
    out = sched.schedule()
    assert out.scheduled[0].spec_token_ids == []
    sched.update_from_output(out, [[2]])
    out = sched.schedule()
    item = out.scheduled[0]
    assert item.spec_token_ids == [3, 1, 2]
    assert (item.num_computed_tokens, item.num_new_tokens) == (7, 4)
    assert len(seq.block_ids) == 3  # room for positions 7..10
    sched.update_from_output(out, [[3, 1, 7]])  # two drafts kept, then the model's own token
    assert seq.output_token_ids == [2, 3, 1, 7]
    assert seq.num_computed_tokens == 10
    assert len(seq.block_ids) == 3
    assert seq.metrics.num_draft_tokens == 3 and seq.metrics.num_accepted_tokens == 2


def test_drafts_stop_at_max_tokens_and_a_stop_token_drops_the_rest():
    sched = make_scheduler(16, 32, 4)
    seq = prompt_seq("a", [1, 2, 3, 1, 2, 3, 1], max_tokens=3)
    sched.add(seq)
    sched.update_from_output(sched.schedule(), [[2]])
    out = sched.schedule()
    # One token out, three allowed: at most one draft plus the model's token.
    assert out.scheduled[0].spec_token_ids == [3]
    sched.update_from_output(out, [[3, 1]])
    assert seq.finish_reason == "length" and seq.output_token_ids == [2, 3, 1]

    seq = prompt_seq("b", [1, 2, EOS, 5, 1, 2, EOS, 5, 1], max_tokens=9)
    sched.add(seq)
    sched.update_from_output(sched.schedule(), [[2]])
    out = sched.schedule()
    assert out.scheduled[0].spec_token_ids == [EOS, 5, 1, 2]
    sched.update_from_output(out, [[EOS, 5, 1, 2, EOS]])  # all kept, but the first one ends it
    assert seq.finish_reason == "stop" and seq.output_token_ids == [2, EOS]
    assert sched.kv_cache.pool.num_free_blocks == 16


def test_drafts_take_only_the_budget_decodes_and_prompts_leave_over():
    sched = make_scheduler(32, 8, 4)
    first = prompt_seq("a", [1, 2, 3, 1, 2, 3, 1], max_tokens=20)
    sched.add(first)
    sched.update_from_output(sched.schedule(), [[2]])
    second = prompt_seq("b", [5, 6, 7, 8, 9], max_tokens=20)
    sched.add(second)
    out = sched.schedule()
    # The decode's token and the whole prompt come first; the 2 tokens left go to drafts.
    assert [(s.seq, s.num_new_tokens) for s in out.scheduled] == [(first, 3), (second, 5)]
    assert out.scheduled[0].spec_token_ids == [3, 1]


def test_no_drafts_while_more_sequences_run_than_the_batch_size_limit():
    kv = KVCacheManager(32, BLOCK_SIZE, enable_prefix_caching=False)
    config = SchedulerConfig(4, 64, max_model_len=64, speculative_disable_by_batch_size=1)
    sched = Scheduler(config, kv, NgramProposer(4, 1, 3))
    first = prompt_seq("a", [1, 2, 3, 1, 2, 3, 1], max_tokens=20)
    sched.add(first)
    sched.update_from_output(sched.schedule(), [[2]])
    out = sched.schedule()
    assert out.scheduled[0].spec_token_ids == [3, 1, 2, 3]
    sched.update_from_output(out, [[3, 1, 2, 3, 1]])
    sched.add(prompt_seq("b", [1, 2, 3, 1, 2, 3, 1], max_tokens=20))
    sched.update_from_output(sched.schedule(), [[2], [2]])
    assert [s.spec_token_ids for s in sched.schedule().scheduled] == [[], []]


def test_drafts_never_reach_past_the_context_length():
    sched = Scheduler(SchedulerConfig(4, 32, max_model_len=12),
                      KVCacheManager(16, BLOCK_SIZE), NgramProposer(4, 1, 3))
    seq = prompt_seq("a", [1, 2, 3, 1, 2, 3, 1, 2, 3], max_tokens=20)
    sched.add(seq)
    sched.update_from_output(sched.schedule(), [[1]])
    out = sched.schedule()
    assert out.scheduled[0].spec_token_ids == [2]  # 10 tokens, room for 2 more: a draft + bonus
    sched.update_from_output(out, [[2, 3]])
    assert seq.num_tokens == 12 and seq.finish_reason == "length"


def test_drafts_the_step_cost_refuses_are_shadow_checked_and_hold_no_blocks():
    costly = StepCost({1: 0.050, 2: 0.100, 3: 0.150})  # each row a full step: never pays
    sched = Scheduler(SchedulerConfig(4, 64, max_model_len=64),
                      KVCacheManager(32, BLOCK_SIZE, enable_prefix_caching=False),
                      NgramProposer(2, 1, 3), costly)
    seq = prompt_seq("a", [1, 2, 3, 1, 2, 3, 1], max_tokens=20)
    sched.add(seq)
    sched.update_from_output(sched.schedule(), [[2]])
    before = sched.proposer.acceptance(seq)

    out = sched.schedule()
    item = out.scheduled[0]
    assert (item.spec_token_ids, item.shadow_draft, item.num_new_tokens) == ([], 3, 1)
    assert len(seq.block_ids) == -(-seq.num_tokens // BLOCK_SIZE)  # none for drafts
    assert sched.drafting.latest.reason().startswith("drafts off")
    sched.update_from_output(out, [[3]])  # the shadow draft was right
    assert sched.proposer.acceptance(seq) > before
    assert (sched.proposer.num_draft_tokens, seq.metrics.num_draft_tokens) == (0, 0)
