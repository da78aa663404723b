"""The checkpoint store: a slot is free, held or cached, never two at once; a cached checkpoint
is found by its hash until it is evicted, least recently used first; held ones are never
evicted, and when every slot is held a new checkpoint is simply not taken."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pagoda.engine.core.checkpoint_store import CheckpointStore

SLOTS = range(4, 7)  # after 4 running sequences' slots


def key(i: int) -> bytes:
    return i.to_bytes(16, "little")


def check(store: CheckpointStore, held: set[int]) -> None:
    cached = list(store._cached.values())
    everyone = list(store._free) + list(store._held) + cached
    assert sorted(everyone) == list(store.slots), "a slot lost or in two states"
    assert store._held == held
    assert store.num_free + store.num_held + store.num_cached == store.num_slots


def test_a_committed_checkpoint_is_found_by_its_hash():
    store = CheckpointStore(SLOTS)
    slot = store.allocate()
    assert slot == 4
    assert store.find(key(1)) is None  # held: its copy may not be made yet
    store.commit(slot, key(1))
    assert store.find(key(1)) == 4


def test_the_least_recently_used_checkpoint_is_evicted_first():
    store = CheckpointStore(SLOTS)
    for i in range(3):
        store.commit(store.allocate(), key(i))
    store.touch(key(0))
    assert store.allocate() == store.slots[1]  # key(1)'s: key(0) was used since
    assert store.find(key(1)) is None
    assert store.find(key(0)) is not None and store.find(key(2)) is not None


def test_held_checkpoints_are_never_evicted():
    store = CheckpointStore(range(2))
    a, b = store.allocate(), store.allocate()
    assert store.allocate() is None
    store.release(a)
    assert store.allocate() == a
    store.commit(b, key(1))
    store.release(a)
    assert store.num_free == 1 and store.num_cached == 1


def test_the_same_prefix_checkpointed_twice_keeps_the_first():
    store = CheckpointStore(SLOTS)
    first, second = store.allocate(), store.allocate()
    store.commit(first, key(7))
    store.commit(second, key(7))
    assert store.find(key(7)) == first
    assert store.num_free == 2


def test_a_store_without_a_slot_is_refused():
    with pytest.raises(ValueError, match="at least one slot"):
        CheckpointStore(range(3, 3))


@settings(max_examples=300, deadline=None)
@given(ops=st.lists(st.tuples(st.sampled_from(["allocate", "commit", "release", "find"]),
                              st.integers(0, 7)), max_size=80),
       num_slots=st.integers(1, 5))
def test_random_use_never_holds_more_checkpoints_than_slots(ops, num_slots):
    store = CheckpointStore(range(10, 10 + num_slots))
    held: set[int] = set()
    for op, n in ops:
        if op == "allocate":
            slot = store.allocate()
            assert (slot is None) == (len(held) == num_slots)
            if slot is not None:
                held.add(slot)
        elif op == "find":
            slot = store.find(key(n))
            assert slot is None or slot not in held
        elif held:
            slot = sorted(held)[n % len(held)]
            held.remove(slot)
            if op == "commit":
                store.commit(slot, key(n))
                assert store.find(key(n)) is not None
            else:
                store.release(slot)
        check(store, held)
