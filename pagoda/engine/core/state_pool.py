"""The recurrent layers' state slots: which running sequence owns which.

A recurrent layer (LFM2's short convolution, Gated DeltaNet, Mamba-2) keeps per sequence a state
of fixed size instead of keys per token. Each running sequence owns one slot, the same in every
recurrent layer's state tensors (the runner holds those): taken when the scheduler admits it,
given back when it finishes, is aborted or is preempted. A preempted sequence's state is lost
with its slot, so it is recomputed from its first token (its next run is "fresh").
"""

from __future__ import annotations

from pagoda.engine.core.sequence import Sequence


class StatePool:
    """Bookkeeping on slot numbers: no tensors live here."""

    def __init__(self, num_slots: int) -> None:
        if num_slots < 1:
            raise ValueError(f"a state pool needs at least one slot, not {num_slots}")
        self.num_slots = num_slots
        # Popped from the end: slot 0 first, and a freed slot is the next one taken.
        self._free = list(range(num_slots - 1, -1, -1))

    @property
    def num_free_slots(self) -> int:
        return len(self._free)

    def can_allocate(self) -> bool:
        return bool(self._free)

    def allocate(self, seq: Sequence) -> None:
        """Give the sequence a slot (its state_slot); call only when can_allocate."""
        assert seq.state_slot is None, f"{seq.request_id} already holds slot {seq.state_slot}"
        seq.state_slot = self._free.pop()

    def free(self, seq: Sequence) -> None:
        """Take the sequence's slot back, if it holds one."""
        if seq.state_slot is None:
            return
        self._free.append(seq.state_slot)
        seq.state_slot = None
