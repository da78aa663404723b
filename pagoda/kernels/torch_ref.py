"""Torch implementations of every kernel: the path for CPUs and the reference for Triton."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from pagoda.kernels.attention_metadata import (
    AttentionMetadata,
    DecodeGroup,
    PrefillSegment,
    TritonAttentionMetadata,
)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    return F.rms_norm(x, weight.shape, weight, eps)


def add_rms_norm(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor,
                 eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Residual add, then norm: returns (normed, new residual)."""
    residual = x.add_(residual)
    return F.rms_norm(residual, weight.shape, weight, eps), residual


def rotary_embedding(x: torch.Tensor, cos: torch.Tensor, sin_signed: torch.Tensor) -> torch.Tensor:
    """Rotate-half RoPE (Hugging Face layout) on x [tokens, heads, head_dim].

    cos is [tokens, 1, head_dim]; sin_signed carries the sign of rotate_half, so that
    rotate_half(x) * sin == roll(x, half) * sin_signed.
    """
    half = x.shape[-1] // 2
    return torch.addcmul(x * cos, torch.roll(x, half, -1), sin_signed)


def silu_and_mul(x: torch.Tensor) -> torch.Tensor:
    gate, up = x.chunk(2, dim=-1)
    return F.silu(gate).mul_(up)


def gelu_tanh_and_mul(x: torch.Tensor) -> torch.Tensor:
    """Gemma's GeGLU: GELU (tanh approximation) of the gate times up."""
    gate, up = x.chunk(2, dim=-1)
    return F.gelu(gate, approximate="tanh").mul_(up)


def row_argmax(logits: torch.Tensor) -> torch.Tensor:
    """Each row's argmax, the first index of its largest value (a NaN counting as largest), as
    `argmax` gives it: `max` over the last dimension returns the same indices about 3x faster
    on a CPU (a 49152-wide vocabulary: 27 against 72 µs a row alone, 0.45 against 1.24 ms for
    32 rows)."""
    return logits.max(dim=-1).indices


def top_k_indices(x: torch.Tensor, k: int) -> torch.Tensor:
    """[rows, n] -> int64 [rows, k]: each row's indices of its k largest values (NaN largest).
    Callers use them as a set: a backend may return them in any order."""
    return x.topk(k, dim=-1).indices


def route(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, top_k: int,
          scoring: str, renormalize: bool, softmax_after_top_k: bool,
          ) -> tuple[torch.Tensor, torch.Tensor]:
    """A mixture-of-experts router: x [m, hidden] against weight [experts, hidden] -> each row's
    top_k expert weights (float32) and ids (int64), best first (`route_logits`)."""
    return route_logits(F.linear(x, weight, bias).float(), top_k, scoring, renormalize,
                        softmax_after_top_k)


def route_logits(logits: torch.Tensor, top_k: int, scoring: str, renormalize: bool,
                 softmax_after_top_k: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """The "softmax" or "sigmoid" scores' top k, renormalised to sum to 1 where asked; or
    (softmax_after_top_k, gpt-oss) the k best logits softmaxed among themselves."""
    if softmax_after_top_k:
        best, ids = logits.topk(top_k, dim=-1)
        return best.softmax(dim=-1), ids
    scores = logits.softmax(dim=-1) if scoring == "softmax" else logits.sigmoid()
    weights, ids = scores.topk(top_k, dim=-1)
    if renormalize:
        weights = weights / weights.sum(dim=-1, keepdim=True)
    return weights, ids


def add_sigmoid_gated(routed: torch.Tensor, shared: torch.Tensor, x: torch.Tensor,
                      gate: torch.Tensor) -> torch.Tensor:
    """routed + shared * sigmoid(x . gate): a shared expert behind its gate ([1, hidden])."""
    return routed + shared * torch.sigmoid(F.linear(x, gate))


def sigmoid_mul(x: torch.Tensor, gate: torch.Tensor) -> torch.Tensor:
    """x * sigmoid(gate): a gated attention's output (Qwen3-Next, Qwen3.5)."""
    return x * torch.sigmoid(gate)


def write_kv_cache(k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor,
                   v_cache: torch.Tensor, slot_mapping: torch.Tensor) -> None:
    """Scatter new keys/values [tokens, kv_heads, head_dim] into [blocks, block_size, ...],
    rounded to the cache's dtype where it is narrower (EngineConfig.kv_cache_dtype)."""
    k_cache.view(-1, *k.shape[1:]).index_copy_(0, slot_mapping, k.to(k_cache.dtype))
    v_cache.view(-1, *v.shape[1:]).index_copy_(0, slot_mapping, v.to(v_cache.dtype))


def paged_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor,
                    v_cache: torch.Tensor, meta: AttentionMetadata, scale: float,
                    softcap: float | None = None,
                    sinks: torch.Tensor | None = None) -> torch.Tensor:
    """Write this step's keys/values into the cache, then attend. q [tokens, heads, head_dim].
    softcap: the scores become softcap * tanh(scores / softcap) before the softmax (Gemma 2).
    sinks [heads]: a logit per query head that joins the softmax's denominator and attends to
    no value (gpt-oss), so a head may give its keys less than all of its weight."""
    write_kv_cache(k, v, k_cache, v_cache, meta.slot_mapping)
    num_tokens, num_heads, head_dim = q.shape
    if len(meta.decode_groups) == 1 and not meta.prefills:
        return _decode_attention(q, k_cache, v_cache, meta, meta.decode_groups[0], scale, softcap,
                                 sinks)
    out = q.new_empty(num_tokens, num_heads * head_dim)
    for group in meta.decode_groups:
        out[group.start:group.end] = _decode_attention(q[group.start:group.end], k_cache, v_cache,
                                                       meta, group, scale, softcap, sinks)
    for seg in meta.prefills:
        out[seg.start:seg.end] = prefill_attention(q, k, v, k_cache, v_cache, seg, scale, softcap,
                                                   sinks)
    return out


def _eager_attention(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor,
                     mask: torch.Tensor, scale: float, softcap: float | None,
                     sinks: torch.Tensor | None) -> torch.Tensor:
    """SDPA's contract (q [..., heads, n, D]; keys, values [..., kv_heads, context, D], each kv
    head serving heads / kv_heads query heads), the mask True where a key takes part, with what
    SDPA has no room for: the scaled scores capped before the softmax, and a sink logit per
    row (sinks broadcast to [..., heads, n, 1]) beside the keys' in the softmax, whose weight
    is dropped. The scores and the softmax run in fp32, as transformers' eager attention does."""
    group = q.shape[-3] // keys.shape[-3]
    if group > 1:
        keys, values = keys.repeat_interleave(group, -3), values.repeat_interleave(group, -3)
    scores = torch.matmul(q.float(), keys.float().transpose(-1, -2)) * scale
    if softcap is not None:
        scores = torch.tanh(scores / softcap) * softcap
    scores = scores.masked_fill(~mask, float("-inf"))
    if sinks is None:
        weights = torch.softmax(scores, dim=-1)
    else:
        sink = sinks.float().expand(*scores.shape[:-1], 1)
        weights = torch.softmax(torch.cat((scores, sink), dim=-1), dim=-1)[..., :-1]
    return torch.matmul(weights, values.float()).to(q.dtype)


def _gather_blocks(cache: torch.Tensor, block_tables: torch.Tensor,
                   out: torch.Tensor | None = None) -> torch.Tensor:
    """[..., n_blocks] block ids -> [..., kv_heads, n_blocks * block_size, head_dim]."""
    num_blocks, _, num_kv_heads, head_dim = cache.shape
    # index_select copies whole rows; advanced indexing was 3-5x slower on CPU here.
    rows = torch.index_select(cache.view(num_blocks, -1), 0, block_tables.reshape(-1), out=out)
    keys = rows.view(*block_tables.shape[:-1], -1, num_kv_heads, head_dim)
    return keys.transpose(-3, -2)


def _decode_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                      meta: AttentionMetadata, group: DecodeGroup, scale: float,
                      softcap: float | None, sinks: torch.Tensor | None) -> torch.Tensor:
    n, num_heads, head_dim = q.shape
    num_kv_heads = k_cache.shape[2]
    k_out, v_out = _decode_workspace(k_cache, v_cache, meta, group.block_tables.numel())
    keys = _gather_blocks(k_cache, group.block_tables, k_out)
    values = _gather_blocks(v_cache, group.block_tables, v_out)
    # The query heads that share a kv head become that head's rows: plain attention, no repeat.
    q = q.reshape(n, num_kv_heads, num_heads // num_kv_heads, head_dim)
    if softcap is not None or sinks is not None:
        # Each kv head's query heads are its rows here: their sinks one per row.
        row_sinks = None if sinks is None else sinks.view(num_kv_heads, -1, 1)
        return _eager_attention(q, keys, values, group.mask, scale, softcap,
                                row_sinks).reshape(n, num_heads * head_dim)
    # A narrower cache is widened once gathered: the attention itself runs in q's dtype.
    o = F.scaled_dot_product_attention(q, keys.to(q.dtype), values.to(q.dtype),
                                       attn_mask=group.mask, scale=scale)
    return o.reshape(n, num_heads * head_dim)


def _decode_workspace(k_cache: torch.Tensor, v_cache: torch.Tensor, meta: AttentionMetadata,
                      num_blocks: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Views of this step's scratch buffers sized for `num_blocks` gathered blocks."""
    block_numel = k_cache[0].numel()
    if meta.decode_workspace is None:
        most = max(g.block_tables.numel() for g in meta.decode_groups)
        meta.decode_workspace = (k_cache.new_empty(most * block_numel),
                                 v_cache.new_empty(most * block_numel))
    k_ws, v_ws = meta.decode_workspace
    size = num_blocks * block_numel
    return k_ws[:size].view(num_blocks, block_numel), v_ws[:size].view(num_blocks, block_numel)


def prefill_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor,
                      v_cache: torch.Tensor, seg: PrefillSegment, scale: float,
                      softcap: float | None = None,
                      sinks: torch.Tensor | None = None) -> torch.Tensor:
    """One prefill segment's queries (rows seg.start..seg.end of q) over its cached keys and
    this step's, after they were written: [seg.end - seg.start, heads * head_dim]."""
    if softcap is not None or sinks is not None:
        return _eager_prefill(q, k_cache, v_cache, seg, scale, softcap, sinks)
    qs = q[seg.start:seg.end].transpose(0, 1).unsqueeze(0)
    if seg.mask is None:
        keys = k[seg.start:seg.end].transpose(0, 1).unsqueeze(0)
        values = v[seg.start:seg.end].transpose(0, 1).unsqueeze(0)
        o = F.scaled_dot_product_attention(qs, keys, values, is_causal=True, scale=scale,
                                           enable_gqa=True)
    else:
        keys = _gather_blocks(k_cache, seg.block_table)[:, :seg.context_len].unsqueeze(0)
        values = _gather_blocks(v_cache, seg.block_table)[:, :seg.context_len].unsqueeze(0)
        o = F.scaled_dot_product_attention(qs, keys.to(q.dtype), values.to(q.dtype),
                                           attn_mask=seg.mask, scale=scale, enable_gqa=True)
    return o.squeeze(0).transpose(0, 1).reshape(seg.end - seg.start, -1)


def _eager_prefill(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                   seg: PrefillSegment, scale: float, softcap: float | None,
                   sinks: torch.Tensor | None) -> torch.Tensor:
    """prefill_attention with capped scores or sinks: the segment's keys read back from the
    cache (this step's were written there first)."""
    n = seg.end - seg.start
    keys = _gather_blocks(k_cache, seg.block_table)[:, :seg.context_len]
    values = _gather_blocks(v_cache, seg.block_table)[:, :seg.context_len]
    mask = seg.mask
    if mask is None:  # keys 0..n-1, causal
        mask = torch.ones(n, n, dtype=torch.bool, device=q.device).tril()
    o = _eager_attention(q[seg.start:seg.end].transpose(0, 1), keys, values, mask, scale, softcap,
                         _head_sinks(sinks))
    return o.transpose(0, 1).reshape(n, -1)


def varlen_paged_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                           k_cache: torch.Tensor, v_cache: torch.Tensor,
                           meta: TritonAttentionMetadata, scale: float,
                           softcap: float | None = None,
                           sinks: torch.Tensor | None = None) -> torch.Tensor:
    """The reference for the Triton kernels: same flat metadata, one sequence at a time, fp32."""
    write_kv_cache(k, v, k_cache, v_cache, meta.slot_mapping)
    out = torch.zeros(q.shape[0], q.shape[1] * q.shape[2], dtype=q.dtype, device=q.device)
    starts = meta.query_start_loc.tolist()
    for i, seq_len in enumerate(meta.seq_lens.tolist()):
        start, end = starts[i], starts[i + 1]
        keys = _gather_blocks(k_cache, meta.block_tables[i])[:, :seq_len].float()
        values = _gather_blocks(v_cache, meta.block_tables[i])[:, :seq_len].float()
        q_pos = torch.arange(seq_len - (end - start), seq_len, device=q.device).unsqueeze(1)
        k_pos = torch.arange(seq_len, device=q.device).unsqueeze(0)
        mask = k_pos <= q_pos
        if meta.sliding_window:
            mask &= k_pos > q_pos - meta.sliding_window
        qs = q[start:end].transpose(0, 1).float()
        if softcap is None and sinks is None:
            o = F.scaled_dot_product_attention(qs, keys, values, attn_mask=mask, scale=scale,
                                               enable_gqa=True)
        else:
            o = _eager_attention(qs, keys, values, mask, scale, softcap, _head_sinks(sinks))
        out[start:end] = o.transpose(0, 1).reshape(end - start, -1).to(q.dtype)
    return out


def _head_sinks(sinks: torch.Tensor | None) -> torch.Tensor | None:
    """[heads] sinks as one per row of [heads, n, context] scores."""
    return None if sinks is None else sinks.view(-1, 1, 1)


def dequantize_int4(packed: torch.Tensor, scales: torch.Tensor, mins: torch.Tensor,
                    group_size: int) -> torch.Tensor:
    """The int4 layout (pagoda.engine.quantization.tensors.Int4Weight) -> fp32 weights [N, K]:
    w[n, k] = q[n, k] * scales[n, k // g] + mins[n, k // g], q the k-th nibble of row n."""
    n = packed.shape[0]
    q = torch.stack((packed & 15, packed >> 4), dim=-1).reshape(n, -1, group_size).float()
    w = torch.addcmul(mins.float().unsqueeze(-1), q, scales.float().unsqueeze(-1))
    return w.reshape(n, -1)


def int4_linear(x: torch.Tensor, packed: torch.Tensor, scales: torch.Tensor, mins: torch.Tensor,
                group_size: int, bias: torch.Tensor | None = None) -> torch.Tensor:
    """x [..., K] times the int4 weight [N, K] transposed, plus bias: dequantized, then a matmul
    in fp32, returned in x's dtype."""
    return _linear_in_fp32(x, dequantize_int4(packed, scales, mins, group_size), bias)


def int8_linear(x: torch.Tensor, q: torch.Tensor, scales: torch.Tensor,
                bias: torch.Tensor | None = None) -> torch.Tensor:
    """x [..., K] times the int8 weight (q [N, K], one scale per row) transposed, plus bias:
    dequantized, then a matmul in fp32, returned in x's dtype."""
    return _linear_in_fp32(x, q.float() * scales.float().unsqueeze(1), bias)


def _linear_in_fp32(x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    out = F.linear(x.float(), w, None if bias is None else bias.float())
    return out.to(x.dtype)
