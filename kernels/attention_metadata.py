"""Per-step attention inputs: plain tensors, built once per step and shared by every layer."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch


@dataclass(slots=True)
class DecodeGroup:
    """Single-token queries [start, end) of similar context length, attended together.

    block_tables [n, max_blocks] (padded with any valid id); mask [n, 1, 1, max_blocks *
    block_size], True where a key takes part.
    """

    start: int
    end: int
    block_tables: torch.Tensor
    mask: torch.Tensor


@dataclass(slots=True)
class PrefillSegment:
    """A run of query tokens [start, end) of one sequence, attending to `context_len` keys.

    `block_table` lists the blocks holding keys 0..context_len-1. `mask` ([q, context_len], True =
    attend) is None when the segment starts at key 0 with a plain causal pattern.
    """

    start: int
    end: int
    context_len: int
    block_table: torch.Tensor
    mask: torch.Tensor | None


@dataclass(slots=True)
class AttentionMetadata:
    """The flat batch holds the decode groups' tokens first, then the prefill segments.

    slot_mapping [num_tokens]: where each token's key and value are written in the cache.
    """

    slot_mapping: torch.Tensor
    decode_groups: list[DecodeGroup] = field(default_factory=list)
    prefills: list[PrefillSegment] = field(default_factory=list)
    # Scratch space for gathered decode keys and values, made by the first layer and reused by
    # the rest: a fresh multi-MB buffer per layer costs more in page faults than the copy itself.
    decode_workspace: tuple[torch.Tensor, torch.Tensor] | None = None

    @property
    def num_decode_tokens(self) -> int:
        return self.decode_groups[-1].end if self.decode_groups else 0
