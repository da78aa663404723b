"""The scheduler over the real KV cache manager: it never leaks, double-frees or shares a block
wrongly, reuses shared prefix blocks, preempts the newest first, and ends a sequence that
outgrows the whole cache with "length".

These run the real Scheduler and KVCacheManager with sampled tokens made up by hypothesis, so
thousands of interleavings are checked without a model.
"""

from collections import Counter

from hypothesis import given, settings
from hypothesis import strategies as st

from pagoda.engine.config import SchedulerConfig
from pagoda.engine.core.kv_cache_manager import KVCacheManager
from pagoda.engine.core.scheduler import Scheduler
from pagoda.engine.core.sequence import Sequence
from pagoda.engine.sampling.params import SamplingParams

BLOCK_SIZE = 4
EOS = 0
PREFIXES = [[5, 6, 7, 8, 9, 10, 11, 12], [5, 6, 7, 8, 20, 21], [30, 31, 32, 33, 34, 35, 36, 37, 38]]


def make_scheduler(num_blocks: int, budget: int, max_seqs: int = 4) -> Scheduler:
    kv = KVCacheManager(num_blocks, BLOCK_SIZE, enable_prefix_caching=True)
    return Scheduler(SchedulerConfig(max_seqs, budget, max_model_len=64), kv)


def check_invariants(sched: Scheduler) -> None:
    pool = sched.kv_cache.pool
    live = list(sched.running) + [s for s in sched.waiting if s.block_ids]
    refs = Counter(b for seq in live for b in seq.block_ids)
    for seq in live:
        assert len(set(seq.block_ids)) == len(seq.block_ids), "a block twice in one table"
    for block in pool.blocks:
        assert block.ref_cnt == refs.get(block.block_id, 0), f"block {block.block_id} refcount"
        assert (block.block_id in pool._free) == (block.ref_cnt == 0)
    for block_hash, block in pool._cached.items():
        assert block.block_hash == block_hash
    for seq in sched.waiting:
        assert seq.block_ids == [], "a waiting sequence holds blocks"


def step(sched: Scheduler, tokens: list[int]) -> None:
    out = sched.schedule()
    for seq in out.preempted:
        assert seq.block_ids == []
    sampled = [[tokens.pop() if tokens else EOS] if item.samples else []
               for item in out.scheduled]
    sched.update_from_output(out, sampled)


ops = st.lists(
    st.one_of(
        st.tuples(st.just("add"), st.integers(0, len(PREFIXES) - 1), st.lists(
            st.integers(1, 50), max_size=6), st.integers(1, 12)),
        st.tuples(st.just("step"), st.lists(st.integers(0, 50), min_size=4, max_size=8)),
        st.tuples(st.just("abort"), st.integers(0, 30)),
    ),
    max_size=60,
)


@settings(max_examples=300, deadline=None)
@given(ops=ops, num_blocks=st.integers(6, 24), budget=st.integers(1, 24))
def test_random_add_step_abort_never_leaks_or_double_frees(ops, num_blocks, budget):
    sched = make_scheduler(num_blocks, budget)
    seqs: list[Sequence] = []
    for op in ops:
        if op[0] == "add":
            _, prefix, suffix, max_tokens = op
            seq = Sequence(f"r{len(seqs)}", PREFIXES[prefix] + suffix,
                           SamplingParams(temperature=0, max_tokens=max_tokens), frozenset({EOS}))
            seqs.append(seq)
            sched.add(seq)
        elif op[0] == "step":
            step(sched, list(op[1]))
        elif seqs:
            sched.finish(seqs[op[1] % len(seqs)], "abort")
        check_invariants(sched)
    for _ in range(2000):
        if not (sched.waiting or sched.running):
            break
        step(sched, [])
        check_invariants(sched)
    assert not (sched.waiting or sched.running), "requests never finished"
    pool = sched.kv_cache.pool
    assert pool.num_free_blocks == pool.num_blocks
    assert all(b.ref_cnt == 0 for b in pool.blocks)


def test_shared_prefix_blocks_are_reused_not_recomputed():
    sched = make_scheduler(num_blocks=16, budget=64)
    first = Sequence("a", PREFIXES[0] + [40, 41], SamplingParams(max_tokens=1), frozenset({EOS}))
    sched.add(first)
    step(sched, [1])
    second = Sequence("b", PREFIXES[0] + [42], SamplingParams(max_tokens=1), frozenset({EOS}))
    sched.add(second)
    out = sched.schedule()
    assert out.scheduled[0].num_computed_tokens == 8
    assert second.num_cached_tokens == 8


def test_preemption_frees_newest_first_and_recomputes_later():
    sched = make_scheduler(num_blocks=4, budget=32)
    old = Sequence("old", [1, 2, 3], SamplingParams(max_tokens=20, ignore_eos=True), frozenset())
    new = Sequence("new", [4, 5, 6], SamplingParams(max_tokens=20, ignore_eos=True), frozenset())
    sched.add(old)
    sched.add(new)
    preempted = []
    for _ in range(12):
        out = sched.schedule()
        preempted += [s.request_id for s in out.preempted]
        sched.update_from_output(out, [[7] if i.samples else [] for i in out.scheduled])
    assert preempted and preempted[0] == "new"
    assert old.num_output_tokens > new.num_output_tokens


def test_a_sequence_that_outgrows_the_whole_cache_ends_with_length():
    sched = make_scheduler(num_blocks=2, budget=32)
    seq = Sequence("big", [1, 2, 3], SamplingParams(max_tokens=50, ignore_eos=True), frozenset())
    sched.add(seq)
    for _ in range(20):
        out = sched.schedule()
        sched.update_from_output(out, [[7] if i.samples else [] for i in out.scheduled])
    assert seq.finish_reason == "length"
    # Every token whose KV fits was computed; the last sampled one needs no KV of its own.
    assert seq.num_computed_tokens == 2 * BLOCK_SIZE
    assert seq.num_tokens == 2 * BLOCK_SIZE + 1
    assert sched.kv_cache.pool.num_free_blocks == 2
