"""Weight-only quantized matmuls in Triton: activations in fp16/bf16/fp32 times int4 or int8
weights in the engine's layouts (engine.quantization.tensors), fp32 accumulation.

Two kernels per format, chosen by the number of activation rows M:
- GEMV (M <= GEMV_MAX_ROWS, decode): one program per block of output features reads those
  weight rows' bytes exactly once, as wide contiguous loads, and applies them to every
  activation row. Memory-bound: the grid is split along N finely enough to fill the GPU.
  int4 sums q * x within each group first and applies scale and min once per group:
  sum_k x_k (q_k s + m) = s * sum_k x_k q_k + m * sum_k x_k.
- GEMM (prefill): tiles of [BLOCK_M, BLOCK_N]; each K-tile of weights is dequantized into
  registers and fed to `tl.dot`.

The references are `int4_linear` and `int8_linear` in `kernels.torch_ref`.
"""

from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl

# At most this many activation rows go through the GEMV; more take the tiled GEMM.
GEMV_MAX_ROWS = 4
# Weight bytes one GEMV program loads per loop iteration, divided by its activation rows (each
# row multiplies the whole tile again): 32 bytes per thread with 4 warps, 16-byte loads, enough
# in flight per SM, no spills.
_GEMV_TILE = 4096
_GEMV_MAX_BLOCK_N = 32


@triton.jit
def _store_rows(out_ptr, acc, bias_ptr, rows, cols, M, N, stride_om, HAS_BIAS: tl.constexpr):
    """acc [rows, cols] (+ bias) -> out, in out's dtype."""
    col_ok = cols < N
    if HAS_BIAS:
        acc += tl.load(bias_ptr + cols, mask=col_ok, other=0.0).to(tl.float32)[None, :]
    out = out_ptr + rows.to(tl.int64)[:, None] * stride_om + cols[None, :]
    tl.store(out, acc.to(out_ptr.dtype.element_ty), mask=(rows < M)[:, None] & col_ok[None, :])


@triton.jit
def _int4_gemv_kernel(out_ptr, x_ptr, packed_ptr, scales_ptr, mins_ptr, bias_ptr, M, N,
                      num_groups, stride_xm, stride_xk, stride_pn, stride_sn, stride_mn,
                      stride_om, HALF_GROUP: tl.constexpr, BLOCK_M: tl.constexpr,
                      BLOCK_N: tl.constexpr, BLOCK_G: tl.constexpr, HAS_BIAS: tl.constexpr):
    rows = tl.arange(0, BLOCK_M)
    cols = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    col_ok = cols < N
    w_rows = packed_ptr + cols.to(tl.int64)[:, None, None] * stride_pn
    s_rows = scales_ptr + cols.to(tl.int64)[:, None] * stride_sn
    m_rows = mins_ptr + cols.to(tl.int64)[:, None] * stride_mn
    byte_in_group = tl.arange(0, HALF_GROUP)
    k_in_group = tl.arange(0, 2 * HALF_GROUP)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for g0 in range(0, num_groups, BLOCK_G):
        groups = g0 + tl.arange(0, BLOCK_G)
        g_ok = groups < num_groups
        byte = groups[:, None] * HALF_GROUP + byte_in_group[None, :]  # [BLOCK_G, HALF_GROUP]
        ks = groups[:, None] * 2 * HALF_GROUP + k_in_group[None, :]  # [BLOCK_G, group size]
        # Each weight row's bytes for BLOCK_G whole groups: one contiguous run, read once.
        b = tl.load(w_rows + byte[None, :, :], mask=col_ok[:, None, None] & g_ok[None, :, None],
                    other=0)
        lo = (b & 15).to(tl.float32)  # even k
        hi = (b >> 4).to(tl.float32)  # odd k
        s_mask = col_ok[:, None] & g_ok[None, :]
        s = tl.load(s_rows + groups[None, :], mask=s_mask, other=0.0).to(tl.float32)
        m = tl.load(m_rows + groups[None, :], mask=s_mask, other=0.0).to(tl.float32)
        for r in tl.static_range(BLOCK_M):
            # Rows past M (BLOCK_M is a power of two) reread the last row; their sums are
            # never stored.
            x_row = x_ptr + tl.minimum(r, M - 1).to(tl.int64) * stride_xm
            xs = tl.load(x_row + ks * stride_xk, mask=g_ok[:, None], other=0.0).to(tl.float32)
            x_even, x_odd = tl.split(tl.reshape(xs, (BLOCK_G, HALF_GROUP, 2)))
            qx = tl.sum(lo * x_even[None, :, :] + hi * x_odd[None, :, :], axis=2)
            x_sum = tl.sum(x_even + x_odd, axis=1)
            row_out = tl.sum(qx * s + x_sum[None, :] * m, axis=1)
            acc += tl.where(rows[:, None] == r, row_out[None, :], 0.0)
    _store_rows(out_ptr, acc, bias_ptr, rows, cols, M, N, stride_om, HAS_BIAS)


@triton.jit
def _int4_weight_tile(packed_ptr, scales_ptr, mins_ptr, cols, g0, num_groups, col_ok,
                      stride_pn, stride_sn, stride_mn, HALF_GROUP: tl.constexpr,
                      GROUPS_PER_TILE: tl.constexpr):
    """Whole groups g0.. of the output features cols, dequantized: fp32 [BLOCK_K, BLOCK_N]."""
    groups = g0 + tl.arange(0, GROUPS_PER_TILE)
    mask = col_ok[:, None] & (groups < num_groups)[None, :]
    byte = groups[:, None] * HALF_GROUP + tl.arange(0, HALF_GROUP)[None, :]
    rows = cols.to(tl.int64)[:, None]
    # [BLOCK_N, groups, bytes]: each row's bytes of the tile are one contiguous run.
    b = tl.load(packed_ptr + rows[:, :, None] * stride_pn + byte[None, :, :],
                mask=mask[:, :, None], other=0)
    s = tl.load(scales_ptr + rows * stride_sn + groups[None, :], mask=mask,
                other=0.0).to(tl.float32)[:, :, None]
    m = tl.load(mins_ptr + rows * stride_mn + groups[None, :], mask=mask,
                other=0.0).to(tl.float32)[:, :, None]
    lo = (b & 15).to(tl.float32) * s + m  # even k
    hi = (b >> 4).to(tl.float32) * s + m  # odd k
    w = tl.reshape(tl.join(lo, hi), (cols.shape[0], GROUPS_PER_TILE * 2 * HALF_GROUP))
    return tl.trans(w)


@triton.jit
def _int4_gemm_kernel(out_ptr, x_ptr, packed_ptr, scales_ptr, mins_ptr, bias_ptr, M, N, K,
                      stride_xm, stride_xk, stride_pn, stride_sn, stride_mn, stride_om,
                      HALF_GROUP: tl.constexpr, GROUPS_PER_TILE: tl.constexpr,
                      BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, HAS_BIAS: tl.constexpr,
                      DOT_PRECISION: tl.constexpr):
    BLOCK_K: tl.constexpr = GROUPS_PER_TILE * 2 * HALF_GROUP
    rows = tl.program_id(1) * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    row_ok = rows < M
    col_ok = cols < N
    x_rows = x_ptr + rows.to(tl.int64)[:, None] * stride_xm
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    num_groups = K // (2 * HALF_GROUP)
    for g0 in range(0, num_groups, GROUPS_PER_TILE):
        ks = g0 * 2 * HALF_GROUP + tl.arange(0, BLOCK_K)
        x = tl.load(x_rows + ks[None, :] * stride_xk, mask=row_ok[:, None] & (ks < K)[None, :],
                    other=0.0)
        w = _int4_weight_tile(packed_ptr, scales_ptr, mins_ptr, cols, g0, num_groups, col_ok,
                              stride_pn, stride_sn, stride_mn, HALF_GROUP, GROUPS_PER_TILE)
        acc = tl.dot(x, w.to(x.dtype), acc, input_precision=DOT_PRECISION)
    _store_rows(out_ptr, acc, bias_ptr, rows, cols, M, N, stride_om, HAS_BIAS)


@triton.jit
def _int8_gemv_kernel(out_ptr, x_ptr, q_ptr, scales_ptr, bias_ptr, M, N, K, stride_xm,
                      stride_xk, stride_qn, stride_s, stride_om, BLOCK_M: tl.constexpr,
                      BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, HAS_BIAS: tl.constexpr):
    rows = tl.arange(0, BLOCK_M)
    cols = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    col_ok = cols < N
    w_rows = q_ptr + cols.to(tl.int64)[:, None] * stride_qn
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        ks = k0 + tl.arange(0, BLOCK_K)
        k_ok = ks < K
        w = tl.load(w_rows + ks[None, :], mask=col_ok[:, None] & k_ok[None, :],
                    other=0).to(tl.float32)
        for r in tl.static_range(BLOCK_M):
            x_row = x_ptr + tl.minimum(r, M - 1).to(tl.int64) * stride_xm  # see the int4 GEMV
            x = tl.load(x_row + ks * stride_xk, mask=k_ok, other=0.0).to(tl.float32)
            acc += tl.where(rows[:, None] == r, tl.sum(w * x[None, :], axis=1)[None, :], 0.0)
    # One scale per output feature: applied once, after the sum.
    acc *= tl.load(scales_ptr + cols * stride_s, mask=col_ok, other=0.0).to(tl.float32)[None, :]
    _store_rows(out_ptr, acc, bias_ptr, rows, cols, M, N, stride_om, HAS_BIAS)


@triton.jit
def _int8_gemm_kernel(out_ptr, x_ptr, q_ptr, scales_ptr, bias_ptr, M, N, K, stride_xm,
                      stride_xk, stride_qn, stride_s, stride_om, BLOCK_M: tl.constexpr,
                      BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, HAS_BIAS: tl.constexpr,
                      DOT_PRECISION: tl.constexpr):
    rows = tl.program_id(1) * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    row_ok = rows < M
    col_ok = cols < N
    x_rows = x_ptr + rows.to(tl.int64)[:, None] * stride_xm
    w_cols = q_ptr + cols.to(tl.int64)[None, :] * stride_qn
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        ks = k0 + tl.arange(0, BLOCK_K)
        k_ok = ks < K
        x = tl.load(x_rows + ks[None, :] * stride_xk, mask=row_ok[:, None] & k_ok[None, :],
                    other=0.0)
        # int8 values are exact in fp16 and bf16: the per-row scale waits for the epilogue.
        w = tl.load(w_cols + ks[:, None], mask=k_ok[:, None] & col_ok[None, :], other=0)
        acc = tl.dot(x, w.to(x.dtype), acc, input_precision=DOT_PRECISION)
    acc *= tl.load(scales_ptr + cols * stride_s, mask=col_ok, other=0.0).to(tl.float32)[None, :]
    _store_rows(out_ptr, acc, bias_ptr, rows, cols, M, N, stride_om, HAS_BIAS)


def int4_linear(x: torch.Tensor, packed: torch.Tensor, scales: torch.Tensor, mins: torch.Tensor,
                group_size: int, bias: torch.Tensor | None = None) -> torch.Tensor:
    """x [..., K] times the int4 weight [N, K] transposed (+ bias), in x's dtype."""
    rows = x.reshape(-1, x.shape[-1])
    _check_int4(rows, packed, scales, mins, group_size)
    out = torch.empty(rows.shape[0], packed.shape[0], dtype=x.dtype, device=x.device)
    if rows.shape[0] == 0:  # a step where no sequence samples reaches the lm_head with none
        pass
    elif rows.shape[0] <= GEMV_MAX_ROWS:
        _launch_int4_gemv(out, rows, packed, scales, mins, group_size, bias)
    else:
        _launch_int4_gemm(out, rows, packed, scales, mins, group_size, bias)
    return out.view(*x.shape[:-1], packed.shape[0])


def int8_linear(x: torch.Tensor, q: torch.Tensor, scales: torch.Tensor,
                bias: torch.Tensor | None = None) -> torch.Tensor:
    """x [..., K] times the int8 weight (q [N, K], one scale per row) transposed (+ bias)."""
    rows = x.reshape(-1, x.shape[-1])
    assert q.shape[1] == rows.shape[1] and q.stride(1) == 1 and scales.shape == q.shape[:1]
    out = torch.empty(rows.shape[0], q.shape[0], dtype=x.dtype, device=x.device)
    if rows.shape[0] == 0:
        pass
    elif rows.shape[0] <= GEMV_MAX_ROWS:
        _launch_int8_gemv(out, rows, q, scales, bias)
    else:
        _launch_int8_gemm(out, rows, q, scales, bias)
    return out.view(*x.shape[:-1], q.shape[0])


def _check_int4(rows: torch.Tensor, packed: torch.Tensor, scales: torch.Tensor,
                mins: torch.Tensor, group_size: int) -> None:
    k = rows.shape[1]
    assert packed.shape[1] * 2 == k and packed.stride(1) == 1, "packed must be [N, K // 2]"
    assert group_size >= 2 and group_size & (group_size - 1) == 0 and k % group_size == 0
    groups = (packed.shape[0], k // group_size)
    assert scales.shape == groups and mins.shape == groups
    assert scales.stride(1) == 1 and mins.stride(1) == 1


def _launch_int4_gemv(out: torch.Tensor, x: torch.Tensor, packed: torch.Tensor,
                      scales: torch.Tensor, mins: torch.Tensor, group_size: int,
                      bias: torch.Tensor | None) -> None:
    m, n = out.shape
    block_m = triton.next_power_of_2(m)
    block_n = _gemv_block_n(n, x.device)
    half = group_size // 2
    block_g = max(1, _GEMV_TILE // (block_m * block_n * half))
    _int4_gemv_kernel[(triton.cdiv(n, block_n),)](
        out, x, packed, scales, mins, _bias_or(bias, out), m, n, x.shape[1] // group_size,
        x.stride(0), x.stride(1), packed.stride(0), scales.stride(0), mins.stride(0),
        out.stride(0), HALF_GROUP=half, BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_G=block_g,
        HAS_BIAS=bias is not None, num_warps=4)


def _launch_int4_gemm(out: torch.Tensor, x: torch.Tensor, packed: torch.Tensor,
                      scales: torch.Tensor, mins: torch.Tensor, group_size: int,
                      bias: torch.Tensor | None) -> None:
    m, n = out.shape
    block_m, block_n, block_k, num_warps = _gemm_tiles(m, x.dtype)
    _int4_gemm_kernel[(triton.cdiv(n, block_n), triton.cdiv(m, block_m))](
        out, x, packed, scales, mins, _bias_or(bias, out), m, n, x.shape[1], x.stride(0),
        x.stride(1), packed.stride(0), scales.stride(0), mins.stride(0), out.stride(0),
        HALF_GROUP=group_size // 2, GROUPS_PER_TILE=max(1, block_k // group_size),
        BLOCK_M=block_m, BLOCK_N=block_n, HAS_BIAS=bias is not None,
        DOT_PRECISION=_dot_precision(x.dtype), num_warps=num_warps, num_stages=3)


def _launch_int8_gemv(out: torch.Tensor, x: torch.Tensor, q: torch.Tensor, scales: torch.Tensor,
                      bias: torch.Tensor | None) -> None:
    m, n = out.shape
    block_m = triton.next_power_of_2(m)
    block_n = _gemv_block_n(n, x.device)
    block_k = max(16, _GEMV_TILE // (block_m * block_n))
    _int8_gemv_kernel[(triton.cdiv(n, block_n),)](
        out, x, q, scales, _bias_or(bias, out), m, n, x.shape[1], x.stride(0), x.stride(1),
        q.stride(0), scales.stride(0), out.stride(0), BLOCK_M=block_m, BLOCK_N=block_n,
        BLOCK_K=block_k, HAS_BIAS=bias is not None, num_warps=4)


def _launch_int8_gemm(out: torch.Tensor, x: torch.Tensor, q: torch.Tensor, scales: torch.Tensor,
                      bias: torch.Tensor | None) -> None:
    m, n = out.shape
    block_m, block_n, block_k, num_warps = _gemm_tiles(m, x.dtype)
    _int8_gemm_kernel[(triton.cdiv(n, block_n), triton.cdiv(m, block_m))](
        out, x, q, scales, _bias_or(bias, out), m, n, x.shape[1], x.stride(0), x.stride(1),
        q.stride(0), scales.stride(0), out.stride(0), BLOCK_M=block_m, BLOCK_N=block_n,
        BLOCK_K=block_k, HAS_BIAS=bias is not None, DOT_PRECISION=_dot_precision(x.dtype),
        num_warps=num_warps, num_stages=3)


def _bias_or(bias: torch.Tensor | None, placeholder: torch.Tensor) -> torch.Tensor:
    """The bias, or any tensor to stand in for the pointer the kernel will not read."""
    if bias is None:
        return placeholder
    assert bias.stride(0) == 1
    return bias


def _gemv_block_n(n: int, device: torch.device) -> int:
    """Output features per GEMV program: the most (up to 32) that still gives every SM two
    programs, since nothing but the grid spreads a GEMV's weight reads over the GPU."""
    wanted = 2 * _sm_count(device)
    block = _GEMV_MAX_BLOCK_N
    while block > 4 and triton.cdiv(n, block) < wanted:
        block //= 2
    return block


def _gemm_tiles(m: int, dtype: torch.dtype) -> tuple[int, int, int, int]:
    """(BLOCK_M, BLOCK_N, BLOCK_K, num_warps) for the GEMM: rows no wider than the batch needs.
    fp32 takes the FMA path (no tensor cores at ieee precision): smaller tiles do not spill."""
    block_m = min(64, max(16, triton.next_power_of_2(m)))
    if dtype == torch.float32:
        return block_m, 64, 32, 8 if block_m == 64 else 4
    block_n = 128 if m >= 128 else 64
    return block_m, block_n, 64, 8 if block_m * block_n >= 64 * 128 else 4


@functools.cache
def _sm_count(device: torch.device) -> int:
    if device.type != "cuda":
        return 1  # the interpreter: any grid will do
    return torch.cuda.get_device_properties(device).multi_processor_count


def _dot_precision(dtype: torch.dtype) -> str:
    # fp32 models expect fp32 matmuls; tf32 would cost ~3 decimal digits.
    return "ieee" if dtype == torch.float32 else "tf32"
