"""Per-step attention inputs: plain tensors, built once per step and shared by every layer."""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import torch


@dataclass(slots=True)
class DecodeGroup:
    """Single-token queries [start, end) of similar context length, attended together.

    block_tables [n, max_blocks] (padded with any valid id); mask [n, 1, 1, max_blocks *
    block_size], True where a key takes part; context_lens [n] int64, the keys each query
    attends (its own included): the mask is keys 0..context_len-1, within the metadata's
    sliding window. Kernels that read the cache in place take context_lens, torch's SDPA the mask.
    """

    start: int
    end: int
    block_tables: torch.Tensor
    mask: torch.Tensor
    context_lens: torch.Tensor


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
    sliding_window: a decode attends only its last this many keys; 0 for all of them (the
    decode masks already say so; kernels that take context lengths read it here).
    """

    slot_mapping: torch.Tensor
    decode_groups: list[DecodeGroup] = field(default_factory=list)
    prefills: list[PrefillSegment] = field(default_factory=list)
    sliding_window: int = 0
    # Scratch space for gathered decode keys and values, made by the first layer and reused by
    # the rest: a fresh multi-MB buffer per layer costs more in page faults than the copy itself.
    decode_workspace: tuple[torch.Tensor, torch.Tensor] | None = None
    # The same step masked for the model's other windows, by window (Gemma 3's global layers
    # beside its windowed ones): built by the model runner, read through `for_window`.
    windowed: dict[int, AttentionMetadata] = field(default_factory=dict)

    @property
    def num_decode_tokens(self) -> int:
        return self.decode_groups[-1].end if self.decode_groups else 0

    def for_window(self, window: int) -> AttentionMetadata:
        """This step's metadata for a layer attending `window` keys back (0: all of them)."""
        return self if window == self.sliding_window else self.windowed[window]


@dataclass(slots=True)
class TritonAttentionMetadata:
    """The flat layout the Triton kernels read, one row per sequence (vLLM's varlen layout).

    slot_mapping [num_tokens] int64: cache slot of each new token; -1 skips the write (padding).
    query_start_loc [num_seqs + 1] int32: sequence i's tokens are [loc[i], loc[i + 1]).
    seq_lens [num_seqs] int32: keys each sequence attends, cached ones and this step's.
    block_tables [num_seqs, max_blocks] int32: blocks holding keys 0..seq_len-1, padded.
    max_query_len: 1 for a decode-only batch, which may then split keys across programs.
    num_kv_splits: programs per (sequence, kv head) over the keys of a decode (flash-decoding);
    a power of two, 1 to attend in one pass.
    sliding_window: keys farther back than this are masked; 0 for none.
    """

    slot_mapping: torch.Tensor
    query_start_loc: torch.Tensor
    seq_lens: torch.Tensor
    block_tables: torch.Tensor
    max_query_len: int
    max_seq_len: int
    num_kv_splits: int = 1
    sliding_window: int = 0
    # The same step for the model's other windows, by window, where their layers keep blocks
    # of their own (a KV cache group each: own block tables and slots).
    windowed: dict[int, TritonAttentionMetadata] = field(default_factory=dict)

    @property
    def num_seqs(self) -> int:
        return self.seq_lens.shape[0]

    def for_window(self, window: int) -> TritonAttentionMetadata:
        """This step's metadata for a layer attending `window` keys back (0: all of them): its
        group's where the runner gave one, else this one's tensors (the kernels mask by the
        number alone)."""
        if window == self.sliding_window:
            return self
        return self.windowed.get(window) or replace(self, sliding_window=window)


def choose_num_kv_splits(num_seqs: int, num_kv_heads: int, max_seq_len: int,
                         num_sms: int) -> int:
    """Splits per decode for flash-decoding: enough (sequence, kv head, split) programs to fill
    twice the GPU's multiprocessors, each split at least 256 keys long; a power of two <= 32."""
    programs = num_seqs * num_kv_heads
    by_length = -(-max_seq_len // 256)
    by_occupancy = -(-2 * num_sms // programs)
    wanted = max(1, min(by_length, by_occupancy))
    return min(1 << (wanted - 1).bit_length(), 32)
