"""The one-token state updates of the recurrent layers in torch: Gated DeltaNet's delta rule and
Mamba-2's selective state update, over a table of state slots. The reference the C kernels
(pagoda/kernels/cpu/recurrent_steps.c) are tested against, and the path where they cannot run.

Shapes as the C kernels take them: states float32 [num_slots, heads, rows, cols], each batch
row's slot in `slots` (int64), advanced in place."""

from __future__ import annotations

import torch


def gdn_step(state: torch.Tensor, slots: torch.Tensor, q: torch.Tensor, k: torch.Tensor,
             v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor,
             tiled: bool = False) -> torch.Tensor:
    """In float32, or float64 where the state or inputs are. q, k [batch, k_heads, k_dim] (q l2-normed and scaled, k l2-normed); v [batch, v_heads,
    v_dim]; g (log decay), beta [batch, v_heads]. Returns out [batch, v_heads, v_dim] float32:
    S *= exp(g); S += k (beta (v - S^T k))^T; out = S^T q. Value head h reads key head
    h // (v_heads / k_heads) (transformers' order), or h % k_heads where `tiled` (the order
    llama.cpp's converter writes Qwen3-Next's and Qwen3.5's value heads in)."""
    dtype = _compute_dtype(state, v)
    q, k = (value_heads(t.to(dtype), v.shape[1], tiled) for t in (q, k))
    s = state[slots].to(dtype) * g.to(dtype).exp()[..., None, None]
    delta = beta.to(dtype)[..., None] * (v.to(dtype) - torch.einsum("bhij,bhi->bhj", s, k))
    s = s + k[..., :, None] * delta[..., None, :]
    state[slots] = s.to(state.dtype)
    return torch.einsum("bhij,bhi->bhj", s, q)


def mamba2_step(state: torch.Tensor, slots: torch.Tensor, x: torch.Tensor, dt: torch.Tensor,
                a: torch.Tensor, b: torch.Tensor, c: torch.Tensor,
                d: torch.Tensor | None) -> torch.Tensor:
    """In float32, or float64 where the state or inputs are. x [batch, heads, head_dim]; dt [batch, heads] (after bias, softplus and limits); a [heads]
    (negative); b, c [batch, groups, state_size]; d [heads] or None. Returns out [batch, heads,
    head_dim] float32: S = S exp(dt a) + dt x b^T; out = S c + d x."""
    dtype = _compute_dtype(state, x)
    per_group = x.shape[1] // b.shape[1]
    b, c = (t.to(dtype).repeat_interleave(per_group, dim=1) for t in (b, c))
    x, dt = x.to(dtype), dt.to(dtype)
    s = state[slots].to(dtype) * (dt * a.to(dtype)).exp()[..., None, None]
    s = s + (dt[..., None] * x)[..., :, None] * b[:, :, None, :]
    state[slots] = s.to(state.dtype)
    out = torch.einsum("bhpn,bhn->bhp", s, c)
    return out if d is None else out + d.to(dtype)[:, None] * x


def value_heads(t: torch.Tensor, v_heads: int, tiled: bool) -> torch.Tensor:
    """Key-head rows [..., k_heads, dim] repeated to one per value head (dim 1)."""
    repeats = v_heads // t.shape[1]
    return t.repeat(1, repeats, 1) if tiled else t.repeat_interleave(repeats, dim=1)


def _compute_dtype(state: torch.Tensor, x: torch.Tensor) -> torch.dtype:
    return torch.promote_types(torch.promote_types(state.dtype, x.dtype), torch.float32)
