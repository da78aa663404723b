"""Paged attention in Triton over block tables, for a mixed batch of prefill chunks and decodes.

Two paths, both reading keys and values only from the paged cache (this step's are written
first):
- `_unified_attention_kernel`: one program per (block of query tokens of one sequence, kv head).
  Its rows are query tokens x the query heads sharing that kv head, so GQA reads each key once.
  Serves prefill chunks that start anywhere (earlier keys come from cached blocks) and decodes.
- `_split_kv_decode_kernel` + `_merge_kv_splits_kernel`: flash-decoding for decode-only batches.
  Each (sequence, kv head) splits its keys across `num_kv_splits` programs, each keeps a partial
  output and its log-sum-exp, and a second kernel merges them. Long contexts then fill the GPU
  even at batch 1.
Both cap the scores (attention logit softcapping) where SOFTCAP is set: a constant of the
compiled kernel, so an uncapped model's kernels are the same as before. Both take attention
sinks where HAS_SINKS is set (gpt-oss): a logit per query head that joins each softmax's
denominator and weighs no value; the unified kernel starts its online softmax from it (as if
from one key of value zero), the split decode adds it when the splits are merged.
The reference is `pagoda.kernels.torch_ref.varlen_paged_attention`.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from pagoda.kernels.attention_metadata import TritonAttentionMetadata
from pagoda.kernels.triton_layers import write_kv_cache

_LOG2E = 1.4426950408889634
# Rows of the unified kernel's tile: small for decode-heavy batches, larger for prefill.
_DECODE_BLOCK_M = 16
_PREFILL_BLOCK_M = 64


@triton.jit
def _find_seq_idx(query_start_loc_ptr, q_block_idx, num_seqs, BLOCK_Q: tl.constexpr):
    """Binary search: the sequence whose query blocks include q_block_idx.

    Sequence i's query blocks start at query_start_loc[i] // BLOCK_Q + i, an upper bound that
    needs no prefix sum over the batch.
    """
    lo = 0
    hi = num_seqs
    while lo < hi:
        mid = (lo + hi) // 2
        first_block = tl.load(query_start_loc_ptr + mid) // BLOCK_Q + mid
        if first_block <= q_block_idx:
            lo = mid + 1
        else:
            hi = mid
    return lo - 1


@triton.jit
def _tanh(x):
    # exp overflows to inf for large x, giving 1; underflows to 0 for very negative x, giving -1.
    return 1.0 - 2.0 / (tl.exp(2.0 * x) + 1.0)


@triton.jit
def _attend_tile(q, acc, m_i, l_i, k_cache_ptr, v_cache_ptr, block_tables_ptr, tile, kv_head,
                 q_pos, seq_len, sliding_window, qk_scale, stride_c_block, stride_c_tok,
                 stride_c_head, BLOCK_SIZE: tl.constexpr, HEAD_DIM: tl.constexpr,
                 HEAD_DIM_PADDED: tl.constexpr, DOT_PRECISION: tl.constexpr,
                 SOFTCAP: tl.constexpr):
    """One paged block of keys into the online softmax of rows at positions q_pos. Scores are
    in log2 units (qk_scale holds log2(e)); SOFTCAP too (cap * log2(e)), 0 for none: capping
    cap * tanh(x / cap) in those units is the same formula."""
    offs_t = tl.arange(0, BLOCK_SIZE)
    dims = tl.arange(0, HEAD_DIM_PADDED)
    block = tl.load(block_tables_ptr + tile).to(tl.int64)
    kv_offsets = (block * stride_c_block + offs_t[:, None] * stride_c_tok
                  + kv_head * stride_c_head + dims[None, :])
    dim_mask = dims[None, :] < HEAD_DIM
    k = tl.load(k_cache_ptr + kv_offsets, mask=dim_mask, other=0.0)
    v = tl.load(v_cache_ptr + kv_offsets, mask=dim_mask, other=0.0)
    s = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION) * qk_scale
    if SOFTCAP > 0:
        s = SOFTCAP * _tanh(s / SOFTCAP)
    key_pos = tile * BLOCK_SIZE + offs_t
    visible = (key_pos[None, :] <= q_pos[:, None]) & (key_pos[None, :] < seq_len)
    if sliding_window > 0:
        visible = visible & (key_pos[None, :] > q_pos[:, None] - sliding_window)
    s = tl.where(visible, s, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(s, 1))
    # A row that has seen no key yet keeps m = -inf; subtracting 0 keeps its terms at 0.
    m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
    p = tl.exp2(s - m_safe[:, None])
    alpha = tl.exp2(m_i - m_safe)
    l_i = l_i * alpha + tl.sum(p, 1)
    acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=DOT_PRECISION)
    return acc, m_new, l_i


@triton.jit
def _unified_attention_kernel(
    out_ptr, q_ptr, k_cache_ptr, v_cache_ptr, block_tables_ptr, seq_lens_ptr,
    query_start_loc_ptr, sinks_ptr, qk_scale, num_seqs, sliding_window,
    stride_q_tok, stride_q_head, stride_o_tok, stride_o_head, stride_bt_seq,
    stride_c_block, stride_c_tok, stride_c_head,
    NUM_QUERIES_PER_KV: tl.constexpr, BLOCK_SIZE: tl.constexpr, HEAD_DIM: tl.constexpr,
    HEAD_DIM_PADDED: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_Q: tl.constexpr,
    DOT_PRECISION: tl.constexpr, SOFTCAP: tl.constexpr, HAS_SINKS: tl.constexpr,
):
    q_block_idx = tl.program_id(0)
    kv_head = tl.program_id(1)
    seq = _find_seq_idx(query_start_loc_ptr, q_block_idx, num_seqs, BLOCK_Q)
    q_start = tl.load(query_start_loc_ptr + seq)
    q_len = tl.load(query_start_loc_ptr + seq + 1) - q_start
    q_block = q_block_idx - (q_start // BLOCK_Q + seq)
    if q_block * BLOCK_Q >= q_len:
        return
    seq_len = tl.load(seq_lens_ptr + seq)
    context_len = seq_len - q_len

    rows = tl.arange(0, BLOCK_M)
    tok = q_block * BLOCK_Q + rows // NUM_QUERIES_PER_KV
    head = kv_head * NUM_QUERIES_PER_KV + rows % NUM_QUERIES_PER_KV
    row_valid = (rows < BLOCK_Q * NUM_QUERIES_PER_KV) & (tok < q_len)
    dims = tl.arange(0, HEAD_DIM_PADDED)
    io_mask = row_valid[:, None] & (dims[None, :] < HEAD_DIM)
    q = tl.load(q_ptr + (q_start + tok)[:, None] * stride_q_tok + head[:, None] * stride_q_head
                + dims[None, :], mask=io_mask, other=0.0)
    q_pos = context_len + tok

    if HAS_SINKS:  # the sink as a first key of weight exp(sink) and value zero
        m_i = tl.load(sinks_ptr + head, mask=row_valid, other=0.0).to(tl.float32) * _LOG2E
        l_i = tl.full([BLOCK_M], 1.0, tl.float32)
    else:
        m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
        l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM_PADDED], tl.float32)
    last_key = context_len + tl.minimum((q_block + 1) * BLOCK_Q, q_len)
    window_start = tl.maximum(context_len + q_block * BLOCK_Q - sliding_window + 1, 0)
    first_tile = tl.where(sliding_window > 0, window_start, 0) // BLOCK_SIZE
    table = block_tables_ptr + seq.to(tl.int64) * stride_bt_seq
    for tile in range(first_tile, tl.cdiv(last_key, BLOCK_SIZE)):
        acc, m_i, l_i = _attend_tile(q, acc, m_i, l_i, k_cache_ptr, v_cache_ptr, table, tile,
                                     kv_head, q_pos, seq_len, sliding_window, qk_scale,
                                     stride_c_block, stride_c_tok, stride_c_head, BLOCK_SIZE,
                                     HEAD_DIM, HEAD_DIM_PADDED, DOT_PRECISION, SOFTCAP)
    acc = acc / tl.where(l_i == 0.0, 1.0, l_i)[:, None]
    tl.store(out_ptr + (q_start + tok)[:, None] * stride_o_tok + head[:, None] * stride_o_head
             + dims[None, :], acc.to(out_ptr.dtype.element_ty), mask=io_mask)


@triton.jit
def _split_kv_decode_kernel(
    partial_out_ptr, partial_lse_ptr, q_ptr, k_cache_ptr, v_cache_ptr, block_tables_ptr,
    seq_lens_ptr, query_start_loc_ptr, qk_scale, sliding_window,
    stride_q_tok, stride_q_head, stride_bt_seq, stride_c_block, stride_c_tok, stride_c_head,
    NUM_HEADS: tl.constexpr, NUM_QUERIES_PER_KV: tl.constexpr, BLOCK_SIZE: tl.constexpr,
    HEAD_DIM: tl.constexpr, HEAD_DIM_PADDED: tl.constexpr, BLOCK_H: tl.constexpr,
    NUM_KV_SPLITS: tl.constexpr, DOT_PRECISION: tl.constexpr, SOFTCAP: tl.constexpr,
):
    seq = tl.program_id(0)
    kv_head = tl.program_id(1)
    split = tl.program_id(2)
    seq_len = tl.load(seq_lens_ptr + seq)
    tok = tl.load(query_start_loc_ptr + seq)

    rows = tl.arange(0, BLOCK_H)
    head = kv_head * NUM_QUERIES_PER_KV + rows
    dims = tl.arange(0, HEAD_DIM_PADDED)
    io_mask = (rows < NUM_QUERIES_PER_KV)[:, None] & (dims[None, :] < HEAD_DIM)
    q = tl.load(q_ptr + tok * stride_q_tok + head[:, None] * stride_q_head + dims[None, :],
                mask=io_mask, other=0.0)
    q_pos = tl.zeros([BLOCK_H], tl.int32) + seq_len - 1

    num_tiles = tl.cdiv(seq_len, BLOCK_SIZE)
    tiles_per_split = tl.cdiv(num_tiles, NUM_KV_SPLITS)
    window_start = tl.where(sliding_window > 0, tl.maximum(seq_len - sliding_window, 0), 0)
    first_tile = tl.maximum(split * tiles_per_split, window_start // BLOCK_SIZE)
    last_tile = tl.minimum(split * tiles_per_split + tiles_per_split, num_tiles)

    m_i = tl.full([BLOCK_H], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_H], tl.float32)
    acc = tl.zeros([BLOCK_H, HEAD_DIM_PADDED], tl.float32)
    table = block_tables_ptr + seq.to(tl.int64) * stride_bt_seq
    for tile in range(first_tile, last_tile):
        acc, m_i, l_i = _attend_tile(q, acc, m_i, l_i, k_cache_ptr, v_cache_ptr, table, tile,
                                     kv_head, q_pos, seq_len, sliding_window, qk_scale,
                                     stride_c_block, stride_c_tok, stride_c_head, BLOCK_SIZE,
                                     HEAD_DIM, HEAD_DIM_PADDED, DOT_PRECISION, SOFTCAP)
    # log2-sum-exp of this split's scores; -inf marks a split that saw no key.
    lse = tl.where(l_i > 0.0, m_i + tl.log2(tl.where(l_i > 0.0, l_i, 1.0)), float("-inf"))
    acc = acc / tl.where(l_i == 0.0, 1.0, l_i)[:, None]
    row = (seq * NUM_HEADS + head) * NUM_KV_SPLITS + split
    tl.store(partial_lse_ptr + row, lse, mask=rows < NUM_QUERIES_PER_KV)
    tl.store(partial_out_ptr + row[:, None] * HEAD_DIM_PADDED + dims[None, :], acc,
             mask=(rows < NUM_QUERIES_PER_KV)[:, None])


@triton.jit
def _merge_kv_splits_kernel(
    out_ptr, partial_out_ptr, partial_lse_ptr, query_start_loc_ptr, sinks_ptr, stride_o_tok,
    stride_o_head, NUM_HEADS: tl.constexpr, HEAD_DIM: tl.constexpr,
    HEAD_DIM_PADDED: tl.constexpr, NUM_KV_SPLITS: tl.constexpr, HAS_SINKS: tl.constexpr,
):
    seq = tl.program_id(0)
    head = tl.program_id(1)
    splits = tl.arange(0, NUM_KV_SPLITS)
    dims = tl.arange(0, HEAD_DIM_PADDED)
    row = (seq * NUM_HEADS + head) * NUM_KV_SPLITS + splits
    lse = tl.load(partial_lse_ptr + row)
    m = tl.max(lse, 0)
    if HAS_SINKS:  # one more split: a single score that weighs no value
        sink = tl.load(sinks_ptr + head).to(tl.float32) * _LOG2E
        m = tl.maximum(m, sink)
    weights = tl.exp2(lse - tl.where(m == float("-inf"), 0.0, m))
    parts = tl.load(partial_out_ptr + row[:, None] * HEAD_DIM_PADDED + dims[None, :])
    total = tl.sum(weights, 0)
    if HAS_SINKS:
        total += tl.exp2(sink - m)
    out = tl.sum(parts * weights[:, None], 0) / tl.where(total == 0.0, 1.0, total)
    tok = tl.load(query_start_loc_ptr + seq)
    tl.store(out_ptr + tok * stride_o_tok + head * stride_o_head + dims,
             out.to(out_ptr.dtype.element_ty), mask=dims < HEAD_DIM)


def paged_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor,
                    v_cache: torch.Tensor, meta: TritonAttentionMetadata, scale: float,
                    softcap: float | None = None,
                    sinks: torch.Tensor | None = None) -> torch.Tensor:
    """Write this step's keys/values into the cache, then attend. q [tokens, heads, head_dim].
    softcap: the scores become softcap * tanh(scores / softcap) before the softmax (Gemma 2).
    sinks [heads]: a logit per query head in the softmax's denominator (gpt-oss)."""
    write_kv_cache(k, v, k_cache, v_cache, meta.slot_mapping)
    num_tokens, num_heads, head_dim = q.shape
    assert q.stride(2) == 1 and k_cache.is_contiguous() and v_cache.is_contiguous()
    assert sinks is None or (sinks.shape == (num_heads,) and sinks.is_contiguous())
    out = q.new_empty(num_tokens, num_heads * head_dim)
    cap = 0.0 if softcap is None else softcap * _LOG2E
    if meta.max_query_len == 1 and meta.num_kv_splits > 1:
        _split_kv_decode(out, q, k_cache, v_cache, meta, scale, cap, sinks)
    else:
        _unified_attention(out, q, k_cache, v_cache, meta, scale, cap, sinks)
    return out


def _dot_precision(dtype: torch.dtype) -> str:
    # fp32 models expect fp32 attention; tf32 would cost ~3 decimal digits.
    return "ieee" if dtype == torch.float32 else "tf32"


def _unified_attention(out: torch.Tensor, q: torch.Tensor, k_cache: torch.Tensor,
                       v_cache: torch.Tensor, meta: TritonAttentionMetadata, scale: float,
                       cap: float, sinks: torch.Tensor | None) -> None:
    num_tokens, num_heads, head_dim = q.shape
    num_kv_heads = k_cache.shape[2]
    per_kv = num_heads // num_kv_heads
    rows = _DECODE_BLOCK_M if meta.max_query_len * per_kv <= _DECODE_BLOCK_M else _PREFILL_BLOCK_M
    block_m = max(rows, triton.next_power_of_2(per_kv))
    block_q = block_m // per_kv
    grid = (num_tokens // block_q + meta.num_seqs, num_kv_heads)
    _unified_attention_kernel[grid](
        out, q, k_cache, v_cache, meta.block_tables, meta.seq_lens, meta.query_start_loc,
        q if sinks is None else sinks, scale * _LOG2E, meta.num_seqs, meta.sliding_window,
        q.stride(0), q.stride(1), out.stride(0), head_dim, meta.block_tables.stride(0),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        NUM_QUERIES_PER_KV=per_kv, BLOCK_SIZE=k_cache.shape[1], HEAD_DIM=head_dim,
        HEAD_DIM_PADDED=triton.next_power_of_2(head_dim), BLOCK_M=block_m, BLOCK_Q=block_q,
        DOT_PRECISION=_dot_precision(q.dtype), SOFTCAP=cap, HAS_SINKS=sinks is not None,
    )


def _split_kv_decode(out: torch.Tensor, q: torch.Tensor, k_cache: torch.Tensor,
                     v_cache: torch.Tensor, meta: TritonAttentionMetadata, scale: float,
                     cap: float, sinks: torch.Tensor | None) -> None:
    _, num_heads, head_dim = q.shape
    num_kv_heads = k_cache.shape[2]
    per_kv = num_heads // num_kv_heads
    splits = meta.num_kv_splits
    padded = triton.next_power_of_2(head_dim)
    partial_out = torch.empty(meta.num_seqs * num_heads * splits, padded, dtype=torch.float32,
                              device=q.device)
    partial_lse = torch.empty(meta.num_seqs * num_heads * splits, dtype=torch.float32,
                              device=q.device)
    _split_kv_decode_kernel[(meta.num_seqs, num_kv_heads, splits)](
        partial_out, partial_lse, q, k_cache, v_cache, meta.block_tables, meta.seq_lens,
        meta.query_start_loc, scale * _LOG2E, meta.sliding_window,
        q.stride(0), q.stride(1), meta.block_tables.stride(0),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        NUM_HEADS=num_heads, NUM_QUERIES_PER_KV=per_kv, BLOCK_SIZE=k_cache.shape[1],
        HEAD_DIM=head_dim, HEAD_DIM_PADDED=padded, BLOCK_H=max(16, triton.next_power_of_2(per_kv)),
        NUM_KV_SPLITS=splits, DOT_PRECISION=_dot_precision(q.dtype), SOFTCAP=cap,
    )
    _merge_kv_splits_kernel[(meta.num_seqs, num_heads)](
        out, partial_out, partial_lse, meta.query_start_loc, q if sinks is None else sinks,
        out.stride(0), head_dim, NUM_HEADS=num_heads, HEAD_DIM=head_dim, HEAD_DIM_PADDED=padded,
        NUM_KV_SPLITS=splits, HAS_SINKS=sinks is not None,
    )

