"""A mixture-of-experts layer's routed experts in Triton, every active expert in two launches.

A step's (row, slot) pairs are sorted by expert and each expert's run padded to whole blocks of
BLOCK_M (`align_pairs`, in torch, with no host sync: the block count is bounded by the shapes).
Then:
1. `_gate_up_kernel`: a grouped GEMM over all the blocks at once. A program takes one block (one
   expert's rows) and a tile of the expert's width, reads that expert's gate and up weights once
   for the block's rows, and applies the activation (SiLU, or gpt-oss's clamped SwiGLU with
   biases) to its fp32 sums: the [pairs, width] activations.
2. `_down_kernel`: the same over down, each pair's output times its router weight, stored in
   fp32 per pair; each row then adds its k slots in its own top-k order, so a row's result does
   not depend on the other rows of the step.

Weights (`ExpertMatrices`): one projection of every expert stacked [experts, N, K], as floats, as
int8 with a scale per group of inputs (and a min where it has one; per channel is one group of
K), or as the packed int4 of `pagoda.engine.quantization.tensors.Int4Weight`. The reference is the
engine's grouped method (`pagoda.engine.layers.moe.GroupedExperts`).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

KINDS = {"float": 0, "int8": 1, "int4": 2}
ACTIVATIONS = {"silu": 0, "swiglu_oai": 1}


@dataclass(frozen=True, slots=True)
class ExpertMatrices:
    """One projection of every expert, [experts, N, K] contiguous. kind "float": values in the
    compute dtype; "int8": int8 values, w = q * scales[e, n, k // group_size] (+ mins[...]);
    "int4": uint8 [experts, N, K // 2], input 2j in byte j's low nibble and 2j + 1 in its high
    one, w = q * scale + min. bias: [experts, N] or None."""

    kind: str
    values: torch.Tensor
    scales: torch.Tensor | None = None
    mins: torch.Tensor | None = None
    group_size: int = 0
    bias: torch.Tensor | None = None

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"unknown expert weight kind {self.kind!r}")
        assert self.values.dim() == 3 and self.values.is_contiguous()
        if self.kind != "float":
            groups = (*self.values.shape[:2], self.in_features // self.group_size)
            assert self.scales is not None and self.scales.shape == groups
            assert self.scales.is_contiguous()
            assert self.mins is None or (self.mins.shape == groups and self.mins.is_contiguous())
        assert self.bias is None or (self.bias.shape == self.values.shape[:2]
                                     and self.bias.is_contiguous())

    @property
    def num_experts(self) -> int:
        return self.values.shape[0]

    @property
    def out_features(self) -> int:
        return self.values.shape[1]

    @property
    def in_features(self) -> int:
        return self.values.shape[2] * (2 if self.kind == "int4" else 1)


@triton.jit
def _weight_tile(values_ptr, scales_ptr, mins_ptr, weight_rows, col_ok, ks, K, num_groups,
                 group_size, KIND: tl.constexpr, HAS_MINS: tl.constexpr):
    """fp32 [BLOCK_K, BLOCK_N]: inputs ks of the weight rows `weight_rows` (int64, the expert's
    first row already added)."""
    mask = (ks < K)[:, None] & col_ok[None, :]
    n = weight_rows[None, :]
    k = ks[:, None]
    if KIND == 0:
        return tl.load(values_ptr + n * K + k, mask=mask, other=0.0).to(tl.float32)
    if KIND == 1:
        q = tl.load(values_ptr + n * K + k, mask=mask, other=0).to(tl.float32)
    else:
        byte = tl.load(values_ptr + n * (K // 2) + k // 2, mask=mask, other=0).to(tl.int32)
        q = ((byte >> ((k % 2) * 4)) & 15).to(tl.float32)
    group = n * num_groups + k // group_size
    w = q * tl.load(scales_ptr + group, mask=mask, other=0.0).to(tl.float32)
    if HAS_MINS:
        w += tl.load(mins_ptr + group, mask=mask, other=0.0).to(tl.float32)
    return w


@triton.jit
def _block_pairs(pairs_ptr, block_experts_ptr, num_pairs, BLOCK_M: tl.constexpr):
    """This program's expert (-1: a block past the step's last), its BLOCK_M pair slots and
    which of them hold a pair."""
    block = tl.program_id(0)
    expert = tl.load(block_experts_ptr + block)
    pairs = tl.load(pairs_ptr + block * BLOCK_M + tl.arange(0, BLOCK_M))
    return expert, pairs, pairs < num_pairs


@triton.jit
def _expert_matmul(a_rows, pair_ok, values_ptr, scales_ptr, mins_ptr, bias_ptr, weight_rows,
                   col_ok, K, num_groups, group_size, KIND: tl.constexpr, HAS_MINS: tl.constexpr,
                   HAS_BIAS: tl.constexpr, DOT_PRECISION: tl.constexpr, BLOCK_M: tl.constexpr,
                   BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    """fp32 [BLOCK_M, BLOCK_N]: the rows a_rows (pointers to each row's first input) times one
    expert's weight rows `weight_rows` transposed, + their bias."""
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        ks = k0 + tl.arange(0, BLOCK_K)
        a = tl.load(a_rows[:, None] + ks[None, :], mask=pair_ok[:, None] & (ks < K)[None, :],
                    other=0.0)
        w = _weight_tile(values_ptr, scales_ptr, mins_ptr, weight_rows, col_ok, ks, K,
                         num_groups, group_size, KIND, HAS_MINS)
        acc = tl.dot(a, w.to(a.dtype), acc, input_precision=DOT_PRECISION)
    if HAS_BIAS:
        acc += tl.load(bias_ptr + weight_rows, mask=col_ok, other=0.0).to(tl.float32)[None, :]
    return acc


@triton.jit
def _gate_up_kernel(act_ptr, x_ptr, pairs_ptr, block_experts_ptr, values_ptr, scales_ptr,
                    mins_ptr, bias_ptr, num_pairs, top_k, width, K, num_groups, group_size,
                    stride_xm, limit, alpha, KIND: tl.constexpr, HAS_MINS: tl.constexpr,
                    HAS_BIAS: tl.constexpr, ACTIVATION: tl.constexpr,
                    DOT_PRECISION: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                    BLOCK_K: tl.constexpr):
    expert, pairs, pair_ok = _block_pairs(pairs_ptr, block_experts_ptr, num_pairs, BLOCK_M)
    if expert < 0:
        return
    # One dot over gate and up interleaved: tile column 2c is gate row c, 2c + 1 up row c (the
    # expert's [2 x width, K] holds gate's rows, then up's).
    tile = tl.arange(0, 2 * BLOCK_N)
    cols = tl.program_id(1) * BLOCK_N + tile // 2
    col_ok = cols < width
    weight_rows = expert.to(tl.int64) * 2 * width + (tile % 2) * width + cols
    x_rows = x_ptr + (pairs // top_k).to(tl.int64) * stride_xm
    acc = _expert_matmul(x_rows, pair_ok, values_ptr, scales_ptr, mins_ptr, bias_ptr,
                         weight_rows, col_ok, K, num_groups, group_size, KIND, HAS_MINS,
                         HAS_BIAS, DOT_PRECISION, BLOCK_M, 2 * BLOCK_N, BLOCK_K)
    gate, up = tl.split(tl.reshape(acc, (BLOCK_M, BLOCK_N, 2)))
    if ACTIVATION == 0:
        h = gate * tl.sigmoid(gate) * up
    else:
        gate = tl.minimum(gate, limit)
        up = tl.minimum(tl.maximum(up, -limit), limit)
        h = gate * tl.sigmoid(gate * alpha) * (up + 1.0)
    cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    out = act_ptr + pairs.to(tl.int64)[:, None] * width + cols[None, :]
    tl.store(out, h.to(act_ptr.dtype.element_ty), mask=pair_ok[:, None] & (cols < width)[None, :])


@triton.jit
def _down_kernel(out_ptr, act_ptr, pairs_ptr, block_experts_ptr, router_ptr, values_ptr,
                 scales_ptr, mins_ptr, bias_ptr, num_pairs, hidden, K, num_groups, group_size,
                 KIND: tl.constexpr, HAS_MINS: tl.constexpr, HAS_BIAS: tl.constexpr,
                 DOT_PRECISION: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                 BLOCK_K: tl.constexpr):
    expert, pairs, pair_ok = _block_pairs(pairs_ptr, block_experts_ptr, num_pairs, BLOCK_M)
    if expert < 0:
        return
    cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    col_ok = cols < hidden
    act_rows = act_ptr + pairs.to(tl.int64) * K
    acc = _expert_matmul(act_rows, pair_ok, values_ptr, scales_ptr, mins_ptr, bias_ptr,
                         expert.to(tl.int64) * hidden + cols, col_ok, K, num_groups, group_size,
                         KIND, HAS_MINS, HAS_BIAS, DOT_PRECISION, BLOCK_M, BLOCK_N, BLOCK_K)
    acc *= tl.load(router_ptr + pairs, mask=pair_ok, other=0.0)[:, None]
    out = out_ptr + pairs.to(tl.int64)[:, None] * hidden + cols[None, :]
    tl.store(out, acc, mask=pair_ok[:, None] & col_ok[None, :])


def align_pairs(topk_ids: torch.Tensor, num_experts: int,
                block_m: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The step's (row, slot) pairs (pair p = row * k + slot) grouped by expert, each expert's
    run padded to whole blocks of block_m with the pair count (an empty slot):
    (pairs [blocks x block_m] int32, each block's expert [blocks] int32, -1 past the last).
    The block count is the bound for these shapes, not the step's own, so nothing waits on
    the device (and a CUDA graph can hold it)."""
    flat = topk_ids.flatten().to(torch.int64)
    num_pairs = flat.numel()
    max_blocks = num_pairs // block_m + min(num_experts, num_pairs)
    # Not bincount: on CUDA it reads the largest id back to size its output.
    counts = torch.zeros(num_experts, dtype=torch.int64, device=flat.device)
    counts.scatter_add_(0, flat, torch.ones_like(flat))
    padded = (counts + block_m - 1) // block_m * block_m
    padded_end = padded.cumsum(0)
    order = flat.argsort(stable=True)
    expert_of = flat[order]
    rank = torch.arange(num_pairs, device=flat.device) - (counts.cumsum(0) - counts)[expert_of]
    pairs = torch.full((max_blocks * block_m,), num_pairs, dtype=torch.int32, device=flat.device)
    pairs[(padded_end - padded)[expert_of] + rank] = order.to(torch.int32)
    block_start = torch.arange(max_blocks, device=flat.device) * block_m
    block_experts = torch.searchsorted(padded_end, block_start, right=True)
    block_experts = torch.where(block_experts < num_experts, block_experts, -1)
    return pairs, block_experts.to(torch.int32)


def fused_experts(x: torch.Tensor, topk_weights: torch.Tensor, topk_ids: torch.Tensor,
                  gate_up: ExpertMatrices, down: ExpertMatrices, activation: str = "silu",
                  limit: float = 0.0, alpha: float = 0.0) -> torch.Tensor:
    """x [m, hidden] through each row's k experts (topk_ids [m, k], any integer type), weighted
    by topk_weights [m, k]: [m, hidden] in x's dtype. gate_up: [experts, 2 x width, hidden],
    each expert's gate rows then its up rows; down: [experts, hidden, width]. activation:
    "silu", or "swiglu_oai" with its limit and alpha."""
    m, k = topk_ids.shape
    hidden, width = down.out_features, down.in_features
    assert x.shape == (m, hidden) and x.stride(1) == 1 and topk_weights.shape == (m, k)
    assert gate_up.in_features == hidden and gate_up.out_features == 2 * width
    assert gate_up.num_experts == down.num_experts
    num_pairs = m * k
    if num_pairs == 0:
        return x.new_zeros(m, hidden)
    block_m = _block_m(num_pairs, gate_up.num_experts)
    pairs, block_experts = align_pairs(topk_ids, gate_up.num_experts, block_m)
    blocks = block_experts.numel()
    act = torch.empty(num_pairs, width, dtype=x.dtype, device=x.device)
    # Each pair's output; _down_kernel writes every element of it.
    out = torch.empty(num_pairs, hidden, dtype=torch.float32, device=x.device)
    block_n, block_k, warps = _tiles(x.dtype)
    precision = "ieee" if x.dtype == torch.float32 else "tf32"
    _gate_up_kernel[(blocks, triton.cdiv(width, block_n))](
        act, x, pairs, block_experts, *_weight_args(gate_up, x), num_pairs, k, width, hidden,
        *_group_args(gate_up), x.stride(0), float(limit), float(alpha),
        **_weight_meta(gate_up), ACTIVATION=ACTIVATIONS[activation], DOT_PRECISION=precision,
        BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=block_k, num_warps=warps)
    router = topk_weights.to(torch.float32).contiguous()
    _down_kernel[(blocks, triton.cdiv(hidden, block_n))](
        out, act, pairs, block_experts, router, *_weight_args(down, x), num_pairs, hidden, width,
        *_group_args(down), **_weight_meta(down), DOT_PRECISION=precision, BLOCK_M=block_m,
        BLOCK_N=block_n, BLOCK_K=block_k, num_warps=warps)
    return out.view(m, k, hidden).sum(dim=1).to(x.dtype)


def _weight_args(w: ExpertMatrices, placeholder: torch.Tensor) -> tuple:
    """The pointers the kernels take; any tensor stands in for one they will not read."""
    return (w.values, _or(w.scales, placeholder), _or(w.mins, placeholder),
            _or(w.bias, placeholder))


def _or(tensor: torch.Tensor | None, placeholder: torch.Tensor) -> torch.Tensor:
    return placeholder if tensor is None else tensor


def _group_args(w: ExpertMatrices) -> tuple[int, int]:
    """(groups a row, inputs a group); floats have none (1 for the unread divisions)."""
    if w.kind == "float":
        return 1, 1
    return w.in_features // w.group_size, w.group_size


def _weight_meta(w: ExpertMatrices) -> dict:
    return {"KIND": KINDS[w.kind], "HAS_MINS": w.mins is not None, "HAS_BIAS": w.bias is not None}


def _block_m(num_pairs: int, num_experts: int) -> int:
    """Rows a block: about an active expert's share of the pairs (decode: 16, the smallest
    tl.dot takes), up to 64 for prefill. Chosen by rule, not timed on a GPU."""
    per_expert = triton.cdiv(num_pairs, min(num_experts, num_pairs))
    return min(64, max(16, triton.next_power_of_2(per_expert)))


def _tiles(dtype: torch.dtype) -> tuple[int, int, int]:
    """(BLOCK_N, BLOCK_K, num_warps) by rule, not timed: fp32 (FMA, no tensor cores) in smaller
    tiles. 8 warps: at 4, some layouts' gate-and-up tiles spilled when compiled for sm_90."""
    if dtype == torch.float32:
        return 32, 32, 8
    return 64, 64, 8
