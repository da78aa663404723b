"""Per-step attention inputs: plain tensors, built once per step and shared by every layer."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch


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
    """The flat batch holds `num_decode_tokens` single-token queries first, then prefill segments.

    slot_mapping [num_tokens]: where each token's key and value are written in the cache.
    decode_block_tables [num_decodes, max_blocks] and decode_mask [num_decodes, 1, 1, keys].
    """

    slot_mapping: torch.Tensor
    num_decode_tokens: int
    decode_block_tables: torch.Tensor | None
    decode_mask: torch.Tensor | None
    prefills: list[PrefillSegment] = field(default_factory=list)
