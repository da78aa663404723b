"""Triton kernels for the per-token layers: RMSNorm (with fused residual add), rotary embedding,
SiLU-and-mul, and the KV cache write. Each computes in fp32 and matches its namesake in
`pagoda.kernels.torch_ref`, which is its reference.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

# Columns per program for the elementwise kernels.
_BLOCK_COLS = 1024


@triton.jit
def _rms_norm_kernel(out_ptr, x_ptr, residual_ptr, weight_ptr, stride_x, stride_r, stride_o,
                     num_cols, eps, HAS_RESIDUAL: tl.constexpr, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    mask = cols < num_cols
    x = tl.load(x_ptr + row * stride_x + cols, mask=mask, other=0.0)
    if HAS_RESIDUAL:
        # Like the reference, the sum is rounded to the model dtype, stored over x as the new
        # residual, and normalised from that rounded value.
        x = (x.to(tl.float32) + tl.load(residual_ptr + row * stride_r + cols, mask=mask,
                                        other=0.0).to(tl.float32)).to(x.dtype)
        tl.store(x_ptr + row * stride_x + cols, x, mask=mask)
    xf = x.to(tl.float32)
    inv_rms = tl.rsqrt(tl.sum(xf * xf, 0) / num_cols + eps)
    w = tl.load(weight_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    tl.store(out_ptr + row * stride_o + cols, (xf * inv_rms * w).to(out_ptr.dtype.element_ty),
             mask=mask)


def _launch_rms_norm(x: torch.Tensor, residual: torch.Tensor | None, weight: torch.Tensor,
                     eps: float) -> torch.Tensor:
    assert x.dim() == 2 and x.stride(1) == 1
    out = torch.empty_like(x)
    num_rows, num_cols = x.shape
    has_residual = residual is not None
    _rms_norm_kernel[(num_rows,)](
        out, x, residual if has_residual else x, weight, x.stride(0),
        residual.stride(0) if has_residual else 0, out.stride(0), num_cols, eps,
        HAS_RESIDUAL=has_residual, BLOCK=triton.next_power_of_2(num_cols),
    )
    return out


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    return _launch_rms_norm(x, None, weight, eps)


def add_rms_norm(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor,
                 eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Residual add, then norm: returns (normed, new residual). The sum overwrites x."""
    return _launch_rms_norm(x, residual, weight, eps), x


@triton.jit
def _rotary_embedding_kernel(out_ptr, x_ptr, cos_ptr, sin_ptr, num_heads, stride_x_tok,
                             stride_x_head, stride_cos_tok, stride_o_tok, stride_o_head,
                             HALF: tl.constexpr, HALF_PADDED: tl.constexpr,
                             BLOCK_H: tl.constexpr):
    tok = tl.program_id(0).to(tl.int64)
    heads = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)
    dims = tl.arange(0, HALF_PADDED)
    mask = (heads < num_heads)[:, None] & (dims < HALF)[None, :]
    x_row = x_ptr + tok * stride_x_tok + heads[:, None] * stride_x_head + dims[None, :]
    x1 = tl.load(x_row, mask=mask, other=0.0).to(tl.float32)
    x2 = tl.load(x_row + HALF, mask=mask, other=0.0).to(tl.float32)
    cs = tok * stride_cos_tok + dims
    cos1 = tl.load(cos_ptr + cs, mask=dims < HALF, other=0.0).to(tl.float32)[None, :]
    cos2 = tl.load(cos_ptr + cs + HALF, mask=dims < HALF, other=0.0).to(tl.float32)[None, :]
    sin1 = tl.load(sin_ptr + cs, mask=dims < HALF, other=0.0).to(tl.float32)[None, :]
    sin2 = tl.load(sin_ptr + cs + HALF, mask=dims < HALF, other=0.0).to(tl.float32)[None, :]
    o_row = out_ptr + tok * stride_o_tok + heads[:, None] * stride_o_head + dims[None, :]
    dtype = out_ptr.dtype.element_ty
    tl.store(o_row, (x1 * cos1 + x2 * sin1).to(dtype), mask=mask)
    tl.store(o_row + HALF, (x2 * cos2 + x1 * sin2).to(dtype), mask=mask)


def rotary_embedding(x: torch.Tensor, cos: torch.Tensor, sin_signed: torch.Tensor) -> torch.Tensor:
    """Rotate-half RoPE on x [tokens, heads, head_dim]; cos, sin_signed [tokens, 1, head_dim]."""
    num_tokens, num_heads, head_dim = x.shape
    assert x.stride(2) == 1 and cos.stride(2) == 1 and cos.stride() == sin_signed.stride()
    out = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    half = head_dim // 2
    block_h = min(triton.next_power_of_2(num_heads), 16)
    _rotary_embedding_kernel[(num_tokens, triton.cdiv(num_heads, block_h))](
        out, x, cos, sin_signed, num_heads, x.stride(0), x.stride(1), cos.stride(0),
        out.stride(0), out.stride(1),
        HALF=half, HALF_PADDED=triton.next_power_of_2(half), BLOCK_H=block_h,
    )
    return out


_SQRT_2_OVER_PI = tl.constexpr(0.7978845608028654)


@triton.jit
def _gated_act_kernel(out_ptr, x_ptr, stride_x, stride_o, num_cols, GELU_TANH: tl.constexpr,
                      BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < num_cols
    gate = tl.load(x_ptr + row * stride_x + cols, mask=mask, other=0.0).to(tl.float32)
    up = tl.load(x_ptr + row * stride_x + num_cols + cols, mask=mask, other=0.0).to(tl.float32)
    if GELU_TANH:
        # tanh(z) = 2 sigmoid(2z) - 1, so 0.5 g (1 + tanh(z)) = g sigmoid(2z).
        inner = _SQRT_2_OVER_PI * (gate + 0.044715 * gate * gate * gate)
        act = gate * tl.sigmoid(2.0 * inner)
    else:
        act = gate * tl.sigmoid(gate)
    tl.store(out_ptr + row * stride_o + cols, (act * up).to(out_ptr.dtype.element_ty), mask=mask)


def silu_and_mul(x: torch.Tensor) -> torch.Tensor:
    """[tokens, 2 * d] (gate then up) -> silu(gate) * up, [tokens, d]."""
    return _gated_act(x, gelu_tanh=False)


def gelu_tanh_and_mul(x: torch.Tensor) -> torch.Tensor:
    """[tokens, 2 * d] (gate then up) -> gelu_tanh(gate) * up, [tokens, d] (Gemma's GeGLU)."""
    return _gated_act(x, gelu_tanh=True)


def _gated_act(x: torch.Tensor, gelu_tanh: bool) -> torch.Tensor:
    assert x.dim() == 2 and x.stride(1) == 1
    num_rows, d = x.shape[0], x.shape[1] // 2
    out = torch.empty(num_rows, d, dtype=x.dtype, device=x.device)
    block = min(triton.next_power_of_2(d), _BLOCK_COLS)
    _gated_act_kernel[(num_rows, triton.cdiv(d, block))](
        out, x, x.stride(0), out.stride(0), d, GELU_TANH=gelu_tanh, BLOCK=block)
    return out


@triton.jit
def _reshape_and_cache_kernel(k_ptr, v_ptr, k_cache_ptr, v_cache_ptr, slot_mapping_ptr,
                              stride_k_tok, stride_v_tok, ROW: tl.constexpr,
                              BLOCK: tl.constexpr):
    tok = tl.program_id(0).to(tl.int64)
    slot = tl.load(slot_mapping_ptr + tok).to(tl.int64)
    if slot < 0:  # a padded token of a CUDA graph batch
        return
    cols = tl.arange(0, BLOCK)
    mask = cols < ROW
    k = tl.load(k_ptr + tok * stride_k_tok + cols, mask=mask)
    v = tl.load(v_ptr + tok * stride_v_tok + cols, mask=mask)
    tl.store(k_cache_ptr + slot * ROW + cols, k, mask=mask)
    tl.store(v_cache_ptr + slot * ROW + cols, v, mask=mask)


def write_kv_cache(k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor,
                   v_cache: torch.Tensor, slot_mapping: torch.Tensor) -> None:
    """Scatter keys/values [tokens, kv_heads, head_dim] into [blocks, block_size, ...] by slot."""
    num_tokens, num_kv_heads, head_dim = k.shape
    # Each token's heads must be one contiguous row, as they are in a slice of the fused QKV.
    for t in (k, v):
        assert t.stride(2) == 1 and t.stride(1) == head_dim
    assert k_cache.is_contiguous() and v_cache.is_contiguous()
    row = num_kv_heads * head_dim
    _reshape_and_cache_kernel[(num_tokens,)](
        k, v, k_cache, v_cache, slot_mapping, k.stride(0), v.stride(0),
        ROW=row, BLOCK=triton.next_power_of_2(row))
