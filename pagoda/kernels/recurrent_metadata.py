"""Per-step inputs of the recurrent layers (Gated DeltaNet, Mamba-2, LFM2's short convolution):
which state slot each sequence of the flat batch reads and writes.

A recurrent layer keeps no keys: each running sequence owns one slot in every recurrent layer's
state tensors (the convolution's last inputs, the SSM or delta-rule state), given by the engine's
state pool. The flat batch is laid out as for attention (pagoda/kernels/attention_metadata.py):
the decoding sequences' single tokens first, then the prefill segments.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import torch


@dataclass(slots=True, frozen=True)
class RecurrentSegment:
    """Tokens [start, end) of the flat batch, one sequence's run of prompt (a prefill chunk).

    slot: the sequence's state slot. fresh: the run begins the sequence (its first chunk, or the
    first after a preemption that dropped the state): the state starts at zero instead of being
    read from the slot. The state after the run's last token is written back to the slot.
    """

    start: int
    end: int
    slot: int
    fresh: bool


@dataclass(slots=True)
class RecurrentMetadata:
    """num_decodes: the batch's first tokens, one per decoding sequence; decode_slots [num_decodes]
    int64: their state slots, in the same order (each advanced one token in place).
    prefills: the segments after them, in order."""

    num_decodes: int
    decode_slots: torch.Tensor
    prefills: list[RecurrentSegment] = field(default_factory=list)

    @property
    def num_tokens(self) -> int:
        return self.prefills[-1].end if self.prefills else self.num_decodes

    def prefills_only(self) -> RecurrentMetadata:
        """The prefill segments alone, counted from the first prefill token: the rest of a
        batch whose decodes ran apart."""
        d = self.num_decodes
        return RecurrentMetadata(0, self.decode_slots[:0],
                                 [replace(s, start=s.start - d, end=s.end - d)
                                  for s in self.prefills])
