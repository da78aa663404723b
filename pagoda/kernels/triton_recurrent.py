"""Triton kernels for the recurrent layers' one-token state updates over a table of state slots:
Gated DeltaNet's delta rule and Mamba-2's selective state update, with the signatures and math
of `pagoda.kernels.recurrent_steps` (their reference).

A program owns one (sequence, head) pair and a block of the state's columns: each column of a
delta-rule state (a value dimension) and each row of a Mamba-2 state (a head dimension) evolves
on its own, so the blocks never meet. The state is read once and written once.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

_BLOCK_V = 32  # delta-rule state columns per program
_BLOCK_P = 16  # Mamba-2 state rows per program


@triton.jit
def _gdn_step_kernel(state_ptr, slots_ptr, q_ptr, k_ptr, v_ptr, g_ptr, beta_ptr, out_ptr,
                     k_heads, v_heads, k_dim, v_dim, TILED: tl.constexpr,
                     K_PAD: tl.constexpr, BLOCK_V: tl.constexpr):
    b = tl.program_id(0).to(tl.int64)
    h = tl.program_id(1).to(tl.int64)
    cols = tl.program_id(2) * BLOCK_V + tl.arange(0, BLOCK_V)
    rows = tl.arange(0, K_PAD)
    col_ok, row_ok = cols < v_dim, rows < k_dim
    if TILED:
        kh = h % k_heads
    else:
        kh = h // (v_heads // k_heads)
    slot = tl.load(slots_ptr + b)
    s_ptr = state_ptr + ((slot * v_heads + h) * k_dim + rows[:, None]) * v_dim + cols[None, :]
    mask = row_ok[:, None] & col_ok[None, :]
    s = tl.load(s_ptr, mask=mask, other=0.0)
    key = tl.load(k_ptr + (b * k_heads + kh) * k_dim + rows, mask=row_ok, other=0.0).to(tl.float32)
    query = tl.load(q_ptr + (b * k_heads + kh) * k_dim + rows, mask=row_ok,
                    other=0.0).to(tl.float32)
    value = tl.load(v_ptr + (b * v_heads + h) * v_dim + cols, mask=col_ok,
                    other=0.0).to(tl.float32)
    decay = tl.exp(tl.load(g_ptr + b * v_heads + h).to(tl.float32))
    beta = tl.load(beta_ptr + b * v_heads + h).to(tl.float32)
    s = s * decay
    recalled = tl.sum(s * key[:, None], 0)
    s = s + key[:, None] * (beta * (value - recalled))[None, :]
    tl.store(s_ptr, s, mask=mask)
    tl.store(out_ptr + (b * v_heads + h) * v_dim + cols, tl.sum(s * query[:, None], 0),
             mask=col_ok)


def gdn_step(state: torch.Tensor, slots: torch.Tensor, q: torch.Tensor, k: torch.Tensor,
             v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor,
             tiled: bool = False) -> torch.Tensor:
    """pagoda.kernels.recurrent_steps.gdn_step on the GPU: state float32 [num_slots, v_heads,
    k_dim, v_dim], contiguous, advanced in place."""
    batch, k_heads, k_dim = k.shape
    v_heads, v_dim = v.shape[1:]
    q, k, v, g, beta = (t.contiguous() for t in (q, k, v, g, beta))
    out = torch.empty(batch, v_heads, v_dim, device=v.device, dtype=torch.float32)
    grid = (batch, v_heads, triton.cdiv(v_dim, _BLOCK_V))
    _gdn_step_kernel[grid](state, slots.contiguous(), q, k, v, g, beta, out, k_heads, v_heads,
                           k_dim, v_dim, TILED=tiled, K_PAD=triton.next_power_of_2(k_dim),
                           BLOCK_V=_BLOCK_V)
    return out


@triton.jit
def _mamba2_step_kernel(state_ptr, slots_ptr, x_ptr, dt_ptr, a_ptr, b_ptr, c_ptr, d_ptr,
                        out_ptr, heads, head_dim, groups, state_size, HAS_D: tl.constexpr,
                        N_PAD: tl.constexpr, BLOCK_P: tl.constexpr):
    b = tl.program_id(0).to(tl.int64)
    h = tl.program_id(1).to(tl.int64)
    rows = tl.program_id(2) * BLOCK_P + tl.arange(0, BLOCK_P)
    cols = tl.arange(0, N_PAD)
    row_ok, col_ok = rows < head_dim, cols < state_size
    group = h // (heads // groups)
    slot = tl.load(slots_ptr + b)
    s_ptr = state_ptr + ((slot * heads + h) * head_dim + rows[:, None]) * state_size + cols[None, :]
    mask = row_ok[:, None] & col_ok[None, :]
    s = tl.load(s_ptr, mask=mask, other=0.0)
    x = tl.load(x_ptr + (b * heads + h) * head_dim + rows, mask=row_ok, other=0.0).to(tl.float32)
    bm = tl.load(b_ptr + (b * groups + group) * state_size + cols, mask=col_ok,
                 other=0.0).to(tl.float32)
    cm = tl.load(c_ptr + (b * groups + group) * state_size + cols, mask=col_ok,
                 other=0.0).to(tl.float32)
    dt = tl.load(dt_ptr + b * heads + h).to(tl.float32)
    decay = tl.exp(dt * tl.load(a_ptr + h).to(tl.float32))
    s = s * decay + (dt * x)[:, None] * bm[None, :]
    tl.store(s_ptr, s, mask=mask)
    y = tl.sum(s * cm[None, :], 1)
    if HAS_D:
        y = y + tl.load(d_ptr + h).to(tl.float32) * x
    tl.store(out_ptr + (b * heads + h) * head_dim + rows, y, mask=row_ok)


def mamba2_step(state: torch.Tensor, slots: torch.Tensor, x: torch.Tensor, dt: torch.Tensor,
                a: torch.Tensor, b: torch.Tensor, c: torch.Tensor,
                d: torch.Tensor | None) -> torch.Tensor:
    """pagoda.kernels.recurrent_steps.mamba2_step on the GPU: state float32 [num_slots, heads,
    head_dim, state_size], contiguous, advanced in place."""
    batch, heads, head_dim = x.shape
    groups, state_size = b.shape[1:]
    x, dt, a, b, c = (t.contiguous() for t in (x, dt, a, b, c))
    out = torch.empty(batch, heads, head_dim, device=x.device, dtype=torch.float32)
    grid = (batch, heads, triton.cdiv(head_dim, _BLOCK_P))
    _mamba2_step_kernel[grid](state, slots.contiguous(), x, dt, a, b, c,
                              a if d is None else d.contiguous(), out, heads, head_dim, groups,
                              state_size, HAS_D=d is not None,
                              N_PAD=triton.next_power_of_2(state_size), BLOCK_P=_BLOCK_P)
    return out
