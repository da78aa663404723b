"""Weight-only quantized matmuls in Triton: activations in fp16/bf16/fp32 times int4 or int8
weights in the engine's layouts (pagoda.engine.quantization.tensors), fp32 accumulation.

Two kernels per format, chosen by the number of activation rows M:
- GEMV (M <= GEMV_MAX_ROWS, decode): split-K, in pagoda/kernels/triton_quant_gemv.py. Layers whose rows
  are not whole 32-bit words (int4: K % 8 or groups under 8; int8: K % 4) take the GEMM instead.
- GEMM (prefill): tiles of [BLOCK_M, BLOCK_N]; each K-tile of weights is dequantized into
  registers and fed to `tl.dot` in x's dtype (tensor cores for fp16 and bf16).

Both are autotuned on a GPU (the GEMM per (N, K, a bucket of M)); under the interpreter each
launch takes one config chosen by rule. The references are `int4_linear` and `int8_linear` in
`pagoda.kernels.torch_ref`.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from pagoda.kernels import triton_quant_gemv as gemv
from pagoda.kernels.triton_quant_gemv import bias_or, nibble_to_float, store_rows

# At most this many activation rows go through the GEMV; more take the tiled GEMM.
GEMV_MAX_ROWS = 4


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
    b = b.to(tl.int32)
    lo = nibble_to_float(b & 15) * s + m  # even k
    hi = nibble_to_float(b >> 4) * s + m  # odd k
    w = tl.reshape(tl.join(lo, hi), (cols.shape[0], GROUPS_PER_TILE * 2 * HALF_GROUP))
    return tl.trans(w)


@triton.jit
def _int4_gemm_kernel(out_ptr, x_ptr, packed_ptr, scales_ptr, mins_ptr, bias_ptr, M, N, K,
                      M_BUCKET, stride_xm, stride_xk, stride_pn, stride_sn, stride_mn,
                      stride_om, HALF_GROUP: tl.constexpr, HAS_BIAS: tl.constexpr,
                      DOT_PRECISION: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                      BLOCK_K: tl.constexpr):
    # M_BUCKET only keys the autotuner. BLOCK_K is a multiple of the group size.
    GROUPS_PER_TILE: tl.constexpr = BLOCK_K // (2 * HALF_GROUP)
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
    store_rows(out_ptr, acc, bias_ptr, rows, cols, M, N, stride_om, HAS_BIAS)


@triton.jit
def _int8_gemm_kernel(out_ptr, x_ptr, q_ptr, scales_ptr, bias_ptr, M, N, K, M_BUCKET,
                      stride_xm, stride_xk, stride_qn, stride_s, stride_om,
                      HAS_BIAS: tl.constexpr, DOT_PRECISION: tl.constexpr, BLOCK_M: tl.constexpr,
                      BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
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
    store_rows(out_ptr, acc, bias_ptr, rows, cols, M, N, stride_om, HAS_BIAS)


def int4_linear(x: torch.Tensor, packed: torch.Tensor, scales: torch.Tensor, mins: torch.Tensor,
                group_size: int, bias: torch.Tensor | None = None) -> torch.Tensor:
    """x [..., K] times the int4 weight [N, K] transposed (+ bias), in x's dtype."""
    rows = x.reshape(-1, x.shape[-1])
    _check_int4(rows, packed, scales, mins, group_size)
    out = torch.empty(rows.shape[0], packed.shape[0], dtype=x.dtype, device=x.device)
    words = _gemv_words(rows, packed) if group_size % 8 == 0 else None
    if rows.shape[0] == 0:  # a step where no sequence samples reaches the lm_head with none
        pass
    elif words is not None:
        gemv.int4_gemv(out, rows, words, scales, mins, group_size, bias)
    else:
        _launch_int4_gemm(out, rows, packed, scales, mins, group_size, bias)
    return out.view(*x.shape[:-1], packed.shape[0])


def int8_linear(x: torch.Tensor, q: torch.Tensor, scales: torch.Tensor,
                bias: torch.Tensor | None = None) -> torch.Tensor:
    """x [..., K] times the int8 weight (q [N, K], one scale per row) transposed (+ bias)."""
    rows = x.reshape(-1, x.shape[-1])
    assert q.shape[1] == rows.shape[1] and q.stride(1) == 1 and scales.shape == q.shape[:1]
    out = torch.empty(rows.shape[0], q.shape[0], dtype=x.dtype, device=x.device)
    words = _gemv_words(rows, q)
    if rows.shape[0] == 0:
        pass
    elif words is not None:
        gemv.int8_gemv(out, rows, words, scales, bias)
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


def _gemv_words(rows: torch.Tensor, weight_bytes: torch.Tensor) -> torch.Tensor | None:
    """The weight as 32-bit words when the GEMV takes these rows, else None (the GEMM)."""
    if not 0 < rows.shape[0] <= GEMV_MAX_ROWS or weight_bytes.shape[0] > gemv.MAX_GEMV_N:
        return None
    return gemv.as_words(weight_bytes)


def _launch_int4_gemm(out: torch.Tensor, x: torch.Tensor, packed: torch.Tensor,
                      scales: torch.Tensor, mins: torch.Tensor, group_size: int,
                      bias: torch.Tensor | None) -> None:
    m, n = out.shape
    args = (out, x, packed, scales, mins, bias_or(bias, out), m, n, x.shape[1], _m_bucket(m),
            x.stride(0), x.stride(1), packed.stride(0), scales.stride(0), mins.stride(0),
            out.stride(0))
    meta = {"HALF_GROUP": group_size // 2, "HAS_BIAS": bias is not None,
            "DOT_PRECISION": _dot_precision(x.dtype)}
    _launch_gemm(_int4_gemm_kernel, INT4_GEMM_TUNED, args, meta, m, n, x.dtype, group_size)


def _launch_int8_gemm(out: torch.Tensor, x: torch.Tensor, q: torch.Tensor, scales: torch.Tensor,
                      bias: torch.Tensor | None) -> None:
    m, n = out.shape
    args = (out, x, q, scales, bias_or(bias, out), m, n, x.shape[1], _m_bucket(m), x.stride(0),
            x.stride(1), q.stride(0), scales.stride(0), out.stride(0))
    meta = {"HAS_BIAS": bias is not None, "DOT_PRECISION": _dot_precision(x.dtype)}
    _launch_gemm(_int8_gemm_kernel, INT8_GEMM_TUNED, args, meta, m, n, x.dtype, 1)


def _launch_gemm(kernel, tuned, args: tuple, meta: dict, m: int, n: int, dtype: torch.dtype,
                 group_size: int) -> None:
    def grid(launch_meta: dict) -> tuple[int, int]:
        return triton.cdiv(n, launch_meta["BLOCK_N"]), triton.cdiv(m, launch_meta["BLOCK_M"])

    if tuned is not None and gemv.AUTOTUNE:
        tuned[grid](*args, **meta)
        return
    block_m, block_n, block_k, num_warps = _gemm_tiles(m, dtype)
    kernel[grid](*args, **meta, BLOCK_M=block_m, BLOCK_N=block_n,
                 BLOCK_K=max(block_k, group_size), num_warps=num_warps, num_stages=3)


def _gemm_tiles(m: int, dtype: torch.dtype) -> tuple[int, int, int, int]:
    """(BLOCK_M, BLOCK_N, BLOCK_K, num_warps) where nothing is timed: rows no wider than the
    batch needs. fp32 takes the FMA path (no tensor cores at ieee precision): smaller tiles do
    not spill."""
    block_m = min(64, max(16, triton.next_power_of_2(m)))
    if dtype == torch.float32:
        return block_m, 64, 32, 8 if block_m == 64 else 4
    block_n = 128 if m >= 128 else 64
    return block_m, block_n, 64, 8 if block_m * block_n >= 64 * 128 else 4


def _m_bucket(m: int) -> int:
    """The autotuner's key for the GEMM's rows: every prefill chunk length would retune."""
    return 16 if m <= 16 else 64 if m <= 64 else 256


def _gemm_configs(tiles: tuple[tuple[int, int, int, int, int], ...]) -> list[triton.Config]:
    return [triton.Config({"BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": bk}, num_warps=warps,
                          num_stages=stages) for bm, bn, bk, warps, stages in tiles]


# (BLOCK_M, BLOCK_N, BLOCK_K, num_warps, num_stages). 16-bit: wgmma-sized tiles, short ones for
# short batches. fp32 (ieee: FMA, no tensor cores): small tiles, or the dot spills.
GEMM_CONFIGS_16BIT = _gemm_configs(((16, 64, 64, 4, 3), (32, 128, 64, 4, 3),
                                    (64, 128, 64, 8, 3), (128, 128, 64, 8, 3)))
GEMM_CONFIGS_FP32 = _gemm_configs(((16, 64, 32, 4, 3), (64, 64, 32, 8, 3)))


def gemm_configs(dtype: torch.dtype, m_bucket: int, group_size: int) -> list[triton.Config]:
    """The GEMM configs timed for x's dtype and a bucket of rows: no taller than the bucket,
    K-tiles widened to whole groups (group_size 1 for int8)."""
    kept: dict[tuple, triton.Config] = {}
    for c in GEMM_CONFIGS_FP32 if dtype == torch.float32 else GEMM_CONFIGS_16BIT:
        if c.kwargs["BLOCK_M"] > max(16, m_bucket):
            continue
        tile = {**c.kwargs, "BLOCK_K": max(c.kwargs["BLOCK_K"], group_size)}
        key = (*tile.values(), c.num_warps, c.num_stages)
        kept.setdefault(key, triton.Config(tile, num_warps=c.num_warps,
                                           num_stages=c.num_stages))
    return list(kept.values())


def _prune_gemm(configs: list[triton.Config], named_args: dict, **kwargs) -> list[triton.Config]:
    return gemm_configs(named_args["x_ptr"].dtype, named_args["M_BUCKET"],
                        2 * kwargs.get("HALF_GROUP", 0) or 1)


INT4_GEMM_TUNED = gemv.autotuned(_int4_gemm_kernel, GEMM_CONFIGS_16BIT + GEMM_CONFIGS_FP32,
                                 ["N", "K", "M_BUCKET"], _prune_gemm)
INT8_GEMM_TUNED = gemv.autotuned(_int8_gemm_kernel, GEMM_CONFIGS_16BIT + GEMM_CONFIGS_FP32,
                                 ["N", "K", "M_BUCKET"], _prune_gemm)


def _dot_precision(dtype: torch.dtype) -> str:
    # fp32 models expect fp32 matmuls; tf32 would cost ~3 decimal digits.
    return "ieee" if dtype == torch.float32 else "tf32"
