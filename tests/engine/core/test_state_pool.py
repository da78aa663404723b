"""The recurrent layers' state slots: every running sequence holds exactly one, no two share
one, and finishing, aborting or preempting gives it back; a model with recurrent layers runs no
more sequences than it has slots, never starts one from cached blocks, and restarts a preempted
one from its first token.

Real Scheduler, KVCacheManager and StatePool with made-up sampled tokens (hypothesis), as in
test_scheduler.py.
"""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pagoda.engine.config import SchedulerConfig
from pagoda.engine.core.kv_cache_manager import KVCacheManager
from pagoda.engine.core.scheduler import Scheduler
from pagoda.engine.core.sequence import Sequence
from pagoda.engine.core.state_pool import StatePool
from pagoda.engine.sampling.params import SamplingParams
from tests.engine.core.test_scheduler import BLOCK_SIZE, EOS, PREFIXES, ops, step


def make_scheduler(num_blocks: int, budget: int, num_slots: int,
                   max_seqs: int = 4) -> Scheduler:
    kv = KVCacheManager(num_blocks, BLOCK_SIZE, enable_prefix_caching=True, recurrent=True)
    return Scheduler(SchedulerConfig(max_seqs, budget, max_model_len=64), kv,
                     states=StatePool(num_slots))


def sequence(name: str, prompt: list[int], max_tokens: int = 20) -> Sequence:
    return Sequence(name, prompt, SamplingParams(max_tokens=max_tokens, ignore_eos=True),
                    frozenset())


def check_slots(sched: Scheduler) -> None:
    pool = sched.states
    slots = [seq.state_slot for seq in sched.running]
    assert None not in slots, "a running sequence without a slot"
    assert len(set(slots)) == len(slots), "two running sequences share a slot"
    assert all(seq.state_slot is None for seq in sched.waiting), "a waiting sequence holds a slot"
    assert pool.num_free_slots + len(slots) == pool.num_slots
    assert len(sched.running) <= pool.num_slots


@settings(max_examples=200, deadline=None)
@given(ops=ops, num_blocks=st.integers(6, 24), budget=st.integers(1, 24),
       num_slots=st.integers(1, 4))
def test_random_add_step_abort_keeps_one_slot_per_running_sequence(ops, num_blocks, budget,
                                                                   num_slots):
    sched = make_scheduler(num_blocks, budget, num_slots)
    seqs: list[Sequence] = []
    for op in ops:
        if op[0] == "add":
            _, prefix, suffix, max_tokens = op
            seq = Sequence(f"r{len(seqs)}", PREFIXES[prefix] + suffix,
                           SamplingParams(temperature=0, max_tokens=max_tokens), frozenset({EOS}))
            seqs.append(seq)
            sched.add(seq)
        elif op[0] == "step":
            out = sched.schedule()
            assert all(item.num_computed_tokens == 0 for item in out.scheduled
                       if item.seq.num_cached_tokens), "a prefix hit"
            sched.update_from_output(out, [[op[1][0]] if item.samples else []
                                           for item in out.scheduled])
        elif seqs:
            sched.finish(seqs[op[1] % len(seqs)], "abort")
        check_slots(sched)
    for _ in range(2000):
        if not (sched.waiting or sched.running):
            break
        step(sched, [])
        check_slots(sched)
    assert not (sched.waiting or sched.running), "requests never finished"
    assert sched.states.num_free_slots == sched.states.num_slots
    assert all(seq.state_slot is None for seq in seqs)


def test_no_more_sequences_run_than_there_are_slots():
    sched = make_scheduler(num_blocks=32, budget=64, num_slots=2)
    seqs = [sequence(f"r{i}", [10 + i, 20, 30]) for i in range(3)]
    for seq in seqs:
        sched.add(seq)
    out = sched.schedule()
    assert [item.seq for item in out.scheduled] == seqs[:2]
    assert sched.waiting[0] is seqs[2]
    sched.finish(seqs[0], "stop")  # its slot is the next one taken
    out = sched.schedule()
    assert seqs[2] in [item.seq for item in out.scheduled]
    assert seqs[2].state_slot == 0


def test_a_preempted_sequence_loses_its_slot_and_restarts_from_its_first_token():
    sched = make_scheduler(num_blocks=4, budget=32, num_slots=4)
    old, new = sequence("old", [1, 2, 3]), sequence("new", [4, 5, 6])
    sched.add(old)
    sched.add(new)
    for _ in range(12):
        out = sched.schedule()
        if out.preempted:
            break
        sched.update_from_output(out, [[7] if i.samples else [] for i in out.scheduled])
    assert out.preempted == [new]
    assert new.state_slot is None and new.num_computed_tokens == 0
    sched.update_from_output(out, [[7] if i.samples else [] for i in out.scheduled])
    sched.finish(old, "abort")
    out = sched.schedule()
    item, = out.scheduled
    assert item.seq is new and item.num_computed_tokens == 0
    assert item.num_new_tokens == new.num_tokens
    assert new.state_slot is not None


def test_a_repeated_prompt_finds_no_cached_blocks_on_a_model_with_recurrent_layers():
    sched = make_scheduler(num_blocks=16, budget=64, num_slots=2)
    first = sequence("a", PREFIXES[0] + [40, 41], max_tokens=1)
    sched.add(first)
    step(sched, [1])
    assert first.is_finished
    again = sequence("b", PREFIXES[0] + [40, 41], max_tokens=1)
    sched.add(again)
    item, = sched.schedule().scheduled
    assert item.num_computed_tokens == 0 and again.num_cached_tokens == 0
    assert sched.kv_cache.pool.num_cached_blocks == 0


def test_a_state_pool_without_a_slot_is_refused():
    with pytest.raises(ValueError, match="at least one slot"):
        StatePool(0)
