"""Checkpoints of the recurrent layers' states at block boundaries, for the prefix cache.

A recurrent layer's state cannot be cut back to an arbitrary token the way a KV cache can, so a
model with such layers (LFM2) starts a new prompt from a cached prefix only where the states at
the prefix's end were kept: a checkpoint, every recurrent layer's states of one sequence after
token b x block_size, in a checkpoint slot of the same state tensors as the running sequences'
slots (the runner copies them; no tensors live here). A checkpoint is found by the chained hash
of the KV block that ends at its boundary, which covers every token before it.

A slot is free, held (a running sequence's latest checkpoint, or one whose copy this step has
ordered: not findable yet) or cached (findable by its hash). Cached ones are evicted least
recently used first when a new checkpoint needs a slot; held ones never are.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass


@dataclass(slots=True, frozen=True)
class Checkpoint:
    """A held checkpoint slot: the states after the sequence's first num_tokens tokens.
    prompt_end: taken at the last block boundary of a prompt, so committed to the store as soon
    as its copy is made; the others are a sequence's latest boundary, kept until it stops."""

    slot: int
    num_tokens: int
    prompt_end: bool = False


class CheckpointStore:
    """Bookkeeping on checkpoint slot numbers (`slots`: the state tensors' indices set aside for
    checkpoints, after the running sequences' slots)."""

    def __init__(self, slots: range) -> None:
        if len(slots) < 1:
            raise ValueError(f"a checkpoint store needs at least one slot, not {len(slots)}")
        self.slots = slots
        # Popped from the end: the lowest slot first.
        self._free = list(reversed(slots))
        self._held: set[int] = set()
        # Insertion order is eviction order: the front was used longest ago.
        self._cached: OrderedDict[bytes, int] = OrderedDict()

    @property
    def num_slots(self) -> int:
        return len(self.slots)

    @property
    def num_cached(self) -> int:
        return len(self._cached)

    @property
    def num_held(self) -> int:
        return len(self._held)

    @property
    def num_free(self) -> int:
        return len(self._free)

    def find(self, block_hash: bytes) -> int | None:
        """The slot of the checkpoint at the end of this block, if cached."""
        return self._cached.get(block_hash)

    def touch(self, block_hash: bytes) -> None:
        """A checkpoint was used: it becomes the last to be evicted."""
        self._cached.move_to_end(block_hash)

    def allocate(self) -> int | None:
        """A slot for a new checkpoint, held: a free one, else the least recently used cached
        one's; None when every slot is held."""
        if self._free:
            slot = self._free.pop()
        elif self._cached:
            _, slot = self._cached.popitem(last=False)
        else:
            return None
        self._held.add(slot)
        return slot

    def commit(self, slot: int, block_hash: bytes) -> bool:
        """Make a held slot's checkpoint findable by the hash of the block ending at its
        boundary; when one is cached under it already (the same prefix checkpointed twice),
        that one stays and this slot is freed. Whether this slot's was kept."""
        assert slot in self._held, f"checkpoint slot {slot} is not held"
        self._held.remove(slot)
        if block_hash in self._cached:
            self._free.append(slot)
            self.touch(block_hash)
            return False
        self._cached[block_hash] = slot
        return True

    def release(self, slot: int) -> None:
        """Give a held slot back without keeping its checkpoint."""
        assert slot in self._held, f"checkpoint slot {slot} is not held"
        self._held.remove(slot)
        self._free.append(slot)
