"""Per-step inputs of the recurrent layers (Gated DeltaNet, Mamba-2, LFM2's short convolution):
which state slot each sequence of the flat batch reads and writes.

A recurrent layer keeps no keys: each running sequence owns one slot in every recurrent layer's
state tensors (the convolution's last inputs, the SSM or delta-rule state), given by the engine's
state pool. The flat batch is laid out as for attention (pagoda/kernels/attention_metadata.py):
the decoding sequences' single tokens first, then the prefill segments.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace

import torch


@dataclass(slots=True, frozen=True)
class RecurrentSegment:
    """Tokens [start, end) of the flat batch, one sequence's run of prompt (a prefill chunk).

    slot: the sequence's state slot. fresh: the run begins the sequence (its first chunk, or the
    first after a preemption that dropped the state): the state starts at zero instead of being
    read from the slot. The state after the run's last token is written back to the slot.
    verifies: the run is a sequence's last token and drafts to verify: the states after each of
    its tokens are kept as well (RecurrentMetadata.kept), so that the slot can be set to those
    after the drafts the sampler accepts, never past a rejected one.
    """

    start: int
    end: int
    slot: int
    fresh: bool
    verifies: bool = False


class KeptStates:
    """The states of verifying runs after each of their tokens: per state tensor (one of a
    layer's, [num_slots, *shape]) and slot, a [run length, *shape] stack, row j the state after
    j + 1 of the run's tokens. Filled by the recurrent layers during the forward, read by the
    runner once it knows how many drafts were accepted."""

    def __init__(self) -> None:
        # Keyed by the state tensor's identity: a layer's tensors live as long as the runner.
        self._after_each: dict[tuple[int, int], tuple[torch.Tensor, torch.Tensor]] = {}

    def keep(self, states: torch.Tensor, slot: int, after_each: torch.Tensor) -> None:
        self._after_each[id(states), slot] = (states, after_each)

    def settle(self, num_tokens: Mapping[int, int]) -> None:
        """Set each kept slot, in every state tensor, to its state after the first
        num_tokens[slot] tokens of its run."""
        for (_, slot), (states, after_each) in self._after_each.items():
            states[slot] = after_each[num_tokens[slot] - 1]

    def __bool__(self) -> bool:
        return bool(self._after_each)


@dataclass(slots=True)
class RecurrentMetadata:
    """num_decodes: the batch's first tokens, one per decoding sequence; decode_slots [num_decodes]
    int64: their state slots, in the same order (each advanced one token in place).
    prefills: the segments after them, in order. kept: the verifying segments' states after each
    of their tokens, once the forward has run."""

    num_decodes: int
    decode_slots: torch.Tensor
    prefills: list[RecurrentSegment] = field(default_factory=list)
    kept: KeptStates = field(default_factory=KeptStates)

    @property
    def num_tokens(self) -> int:
        return self.prefills[-1].end if self.prefills else self.num_decodes

    def prefills_only(self) -> RecurrentMetadata:
        """The prefill segments alone, counted from the first prefill token: the rest of a
        batch whose decodes ran apart. Their verifying segments' kept states go to this
        step's `kept`, which the runner reads."""
        d = self.num_decodes
        return RecurrentMetadata(0, self.decode_slots[:0],
                                 [replace(s, start=s.start - d, end=s.end - d)
                                  for s in self.prefills], kept=self.kept)
