"""The scheduler's recurrent state checkpoints: a prompt's chunk ends at its last block boundary
and the states there are copied out; a decode reaching a block boundary replaces the
sequence's latest checkpoint, which the store keeps when it stops; a later prompt sharing the
prefix starts at the deepest matched boundary with a checkpoint, restored into its slot first.
The store never holds more checkpoints than its slots, and every held one belongs to a live
sequence.

Real Scheduler, KVCacheManager, StatePool and CheckpointStore with made-up sampled tokens
(hypothesis), as in test_state_pool.py.
"""

from hypothesis import given, settings
from hypothesis import strategies as st

from pagoda.engine.config import SchedulerConfig
from pagoda.engine.core.checkpoint_store import CheckpointStore
from pagoda.engine.core.kv_cache_manager import KVCacheManager
from pagoda.engine.core.scheduler import Scheduler, SchedulerOutput
from pagoda.engine.core.sequence import Sequence
from pagoda.engine.core.state_pool import StatePool
from pagoda.engine.sampling.params import SamplingParams
from tests.engine.core.test_scheduler import BLOCK_SIZE, EOS, PREFIXES, ops
from tests.engine.core.test_state_pool import check_slots

PROMPT = list(range(100, 110))  # 10 tokens: blocks of 4 end at 4 and 8


def make_scheduler(num_blocks: int = 32, budget: int = 64, num_slots: int = 2,
                   num_checkpoints: int = 4, max_seqs: int = 4) -> Scheduler:
    store = CheckpointStore(range(num_slots, num_slots + num_checkpoints))
    kv = KVCacheManager(num_blocks, BLOCK_SIZE, recurrent=True, checkpoints=store)
    return Scheduler(SchedulerConfig(max_seqs, budget, max_model_len=64), kv,
                     states=StatePool(num_slots))


def sequence(name: str, prompt: list[int], max_tokens: int = 20) -> Sequence:
    return Sequence(name, prompt, SamplingParams(max_tokens=max_tokens, ignore_eos=True),
                    frozenset())


def run_step(sched: Scheduler, token: int = 7) -> SchedulerOutput:
    out = sched.schedule()
    sched.update_from_output(out, [[token] if item.samples else [] for item in out.scheduled])
    return out


def run_to_end(sched: Scheduler) -> list[SchedulerOutput]:
    outs = []
    while sched.running or sched.waiting:
        outs.append(run_step(sched))
    return outs


def test_a_prompt_chunk_ends_at_its_last_block_boundary_and_its_states_are_saved_there():
    sched = make_scheduler()
    seq = sequence("a", PROMPT, max_tokens=1)
    sched.add(seq)
    out = run_step(sched)
    item, = out.scheduled
    assert (item.num_computed_tokens, item.num_new_tokens) == (0, 8)
    assert out.save_states == [(seq.state_slot, 2)]
    assert sched.kv_cache.checkpoints.find(seq.block_hashes[1]) == 2  # committed at once
    out = run_step(sched)
    item, = out.scheduled
    assert (item.num_computed_tokens, item.num_new_tokens) == (8, 2)
    assert out.save_states == []


def test_budget_chunks_still_end_at_the_prompts_last_boundary():
    sched = make_scheduler(budget=3)
    seq = sequence("a", PROMPT, max_tokens=1)
    sched.add(seq)
    chunks = [(item.num_computed_tokens, item.num_new_tokens)
              for out in run_to_end(sched) for item in out.scheduled]
    assert chunks == [(0, 3), (3, 3), (6, 2), (8, 2)]


def test_a_decode_at_a_block_boundary_replaces_the_latest_checkpoint_kept_at_finish():
    sched = make_scheduler()
    seq = sequence("a", PROMPT, max_tokens=8)
    sched.add(seq)
    outs = run_to_end(sched)
    saves = [(i, out.save_states) for i, out in enumerate(outs) if out.save_states]
    # Prompt end at 8, then decodes reaching 12 and 16 (10 prompt + 8 replies: 17 computed).
    assert [i for i, _ in saves] == [0, 3, 7]
    store = sched.kv_cache.checkpoints
    assert store.num_held == 0
    # The prompt's end and the latest boundary are kept; the one at 12 was replaced.
    assert store.num_cached == 2
    assert store.find(seq.block_hashes[1]) is not None
    assert store.find(seq.block_hashes[2]) is None
    assert store.find(seq.block_hashes[3]) is not None


def test_a_second_turn_restores_the_first_turns_latest_checkpoint():
    sched = make_scheduler()
    first = sequence("a", PROMPT, max_tokens=8)
    sched.add(first)
    run_to_end(sched)
    second = sequence("b", first.all_token_ids + [60, 61, 62])
    sched.add(second)
    out = run_step(sched)
    item, = out.scheduled
    assert item.num_computed_tokens == 16 == second.num_cached_tokens
    checkpoint = sched.kv_cache.checkpoints.find(first.block_hashes[3])
    assert out.restore_states == [(checkpoint, second.state_slot)]


def test_a_prefix_without_a_checkpoint_at_any_matched_boundary_is_computed_again():
    sched = make_scheduler()
    first = sequence("a", PROMPT[:3] + [1] * 5, max_tokens=1)  # checkpointed at 8 only
    sched.add(first)
    run_to_end(sched)
    second = sequence("b", PROMPT[:3] + [1] + [2] * 6)  # shares block 0, no checkpoint at 4
    sched.add(second)
    item, = run_step(sched).scheduled
    assert item.num_computed_tokens == 0 and not second.num_cached_tokens


def test_a_shared_system_prompt_is_found_at_its_prompt_end_checkpoint():
    sched = make_scheduler()
    system = list(range(200, 212))
    first = sequence("a", system + [1, 2], max_tokens=1)
    sched.add(first)
    run_to_end(sched)
    second = sequence("b", system + [3, 4, 5])
    sched.add(second)
    out = run_step(sched)
    assert out.scheduled[0].num_computed_tokens == 12
    assert out.restore_states == [(sched.kv_cache.checkpoints.find(first.block_hashes[2]),
                                   second.state_slot)]


def test_a_preempted_sequence_resumes_from_its_own_latest_checkpoint():
    sched = make_scheduler(num_blocks=7, num_checkpoints=6)
    old, new = sequence("old", PROMPT[:7], max_tokens=20), sequence("new", [1, 2, 3, 4, 5])
    sched.add(old)
    sched.add(new)
    preempted = None
    for _ in range(40):
        out = run_step(sched)
        if out.preempted:
            preempted = out.preempted[0]
            break
    assert preempted is new and new.num_output_tokens > 3  # decoded past a boundary
    assert new.checkpoint is None and new.state_slot is None
    # Its latest boundary: the last one before its last token, which was never computed.
    latest = (new.num_tokens - 1) // BLOCK_SIZE * BLOCK_SIZE
    sched.finish(old, "abort")
    out = run_step(sched)
    item, = out.scheduled
    assert item.seq is new and item.num_computed_tokens == latest
    checkpoint = sched.kv_cache.checkpoints.find(new.block_hashes[latest // BLOCK_SIZE - 1])
    assert out.restore_states == [(checkpoint, new.state_slot)]


def test_with_every_checkpoint_slot_held_no_checkpoint_is_taken():
    sched = make_scheduler(num_checkpoints=1)
    a, b = sequence("a", PROMPT, max_tokens=8), sequence("b", PROMPT[::-1], max_tokens=8)
    sched.add(a)
    sched.add(b)
    out = sched.schedule()
    assert len(out.save_states) == 1  # a's prompt end; b finds no slot
    sched.update_from_output(out, [[] for _ in out.scheduled])
    run_to_end(sched)
    assert sched.kv_cache.checkpoints.num_held == 0


def check_checkpoints(sched: Scheduler) -> None:
    store = sched.kv_cache.checkpoints
    assert store.num_free + store.num_held + store.num_cached == store.num_slots
    held = [s.checkpoint.slot for s in sched.running if s.checkpoint is not None]
    assert all(s.pending_checkpoint is None for s in sched.running), "a copy never kept"
    assert all(s.checkpoint is None for s in sched.waiting), "a waiting sequence holds one"
    assert sorted(held) == sorted(store._held), "a held checkpoint slot without its sequence"


@settings(max_examples=200, deadline=None)
@given(ops=ops, num_blocks=st.integers(6, 24), budget=st.integers(1, 24),
       num_slots=st.integers(1, 4), num_checkpoints=st.integers(1, 5))
def test_random_add_step_abort_never_holds_more_checkpoints_than_slots(
        ops, num_blocks, budget, num_slots, num_checkpoints):
    sched = make_scheduler(num_blocks, budget, num_slots, num_checkpoints)
    slots = range(num_slots, num_slots + num_checkpoints)
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
            for src, dst in out.restore_states:
                assert src in slots and dst < num_slots
            for src, dst in out.save_states:
                assert src < num_slots and dst in slots
            restored = {dst for _, dst in out.restore_states}
            for item in out.scheduled:
                # A sequence starts mid-prompt only from a checkpoint restored into its slot.
                if item.num_computed_tokens and item.seq.num_computed_tokens == 0:
                    assert item.seq.state_slot in restored
            sched.update_from_output(out, [[op[1][0]] if item.samples else []
                                           for item in out.scheduled])
        elif seqs:
            sched.finish(seqs[op[1] % len(seqs)], "abort")
        check_slots(sched)
        check_checkpoints(sched)
    for _ in range(2000):
        if not (sched.waiting or sched.running):
            break
        run_step(sched, EOS)
        check_checkpoints(sched)
    assert not (sched.waiting or sched.running), "requests never finished"
    assert sched.kv_cache.checkpoints.num_held == 0
