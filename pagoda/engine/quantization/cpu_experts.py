"""A mixture-of-experts layer's routed experts on the CPU through our own kernel,
pagoda/kernels/cpu/moe_experts.c: the experts' GGUF blocks read where the file's memory map holds them
(`GGUFRows`, pagoda/engine/quantization/expert_weights.py), one C call a layer and step, each active
expert's weights read once for all the rows routed to it.

`in_place_experts` is what `pagoda.engine.layers.moe.experts_method_for` asks first on a CPU; it
answers None (and the layer's default method runs, on the experts' decoded copies) where the
experts are not GGUF rows of types the kernel reads, the activation is another, or the library
cannot be built here.
"""

from __future__ import annotations

import functools
import logging
import sys
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from functools import partial
from typing import Protocol

import torch

from pagoda.engine.quantization.cpu_paths import second_wins_from
from pagoda.engine.quantization.native_kernels import load_native
from pagoda.engine.quantization.native_linear import Scratch
from pagoda.engine.quantization.tensors import GGUFRows, Weight
from pagoda.kernels.cpu.moe_experts import (
    ACTIVATIONS,
    BLOCKS,
    CExperts,
    MoeExperts,
    MoeLayer,
    Projection,
)
from pagoda.kernels.cpu.moe_tiles import MoeTiles

logger = logging.getLogger(__name__)

_AVX2 = 1
# Rows a kernel call takes at most: a prefill chunk goes in slices, which bounds the scratch
# (an intermediate row, its quantized copy and an output row for each of a row's k experts:
# 26 MB at 256 rows of Qwen3-30B-A3B, where 2,048 rows would take 206) and changes no row's
# result (a row's output does not depend on its company). Each slice still reads an expert
# once for all its rows routed to it (~16 of 256 at 8 of 128 experts).
ROWS_A_CALL = 256
# Rows a call of moe_tiles (the kernel for steps whose experts each get many rows: a prefill
# chunk) takes at most; its scratch holds an fp32 row per (row, slot) pair: ~40 MB at 512 rows
# of Qwen3-30B-A3B.
TILES_ROWS_A_CALL = 512
# Rows routed to one expert at which the load-time calibration times both kernels.
CALIBRATION_ROWS = (4, 8, 16, 32)


class ExpertWeightsLike(Protocol):
    """One expert's weights (pagoda.engine.layers.moe.ExpertWeights)."""

    gate: Weight
    up: Weight
    down: Weight
    gate_bias: torch.Tensor | None
    up_bias: torch.Tensor | None
    down_bias: torch.Tensor | None


@dataclass(frozen=True, slots=True)
class ManyRows:
    """moe_tiles for a layer's calls whose experts get at least `from_rows` rows each on
    average (the call's rows times top k over the layer's experts), as the load-time
    calibration measured it faster from there."""

    kernel: MoeTiles
    from_rows: int


class CpuExpertsMethod:
    """`ExpertsMethod` of a layer whose experts moe_experts reads in place, and moe_tiles for
    calls of many rows an expert where `many` says so. The quantized activations' scratch is
    one per thread, shared by every layer (a model is stepped by one thread at a time). A
    row's output never depends on the other rows of its call within one kernel; the two
    kernels round alike products differently."""

    __slots__ = ("_kernel", "_layer", "_many")

    def __init__(self, kernel: MoeExperts, layer: MoeLayer, many: ManyRows | None = None) -> None:
        self._kernel = kernel
        self._layer = layer
        self._many = many

    def apply(self, x: torch.Tensor, topk_weights: torch.Tensor,
              topk_ids: torch.Tensor) -> torch.Tensor:
        rows = x.float().contiguous()
        ids = topk_ids.to(torch.int64).contiguous()
        weights = topk_weights.float().contiguous()
        m = rows.shape[0]
        step = (TILES_ROWS_A_CALL if self.runs_tiles(min(m, TILES_ROWS_A_CALL), ids.shape[1])
                else ROWS_A_CALL)
        out = torch.empty(m, rows.shape[1])
        for start in range(0, m, step):
            part = slice(start, start + step)
            self._forward(rows[part], ids[part], weights[part], out[part])
        return out if x.dtype == torch.float32 else out.to(x.dtype)

    def runs_tiles(self, m: int, top_k: int) -> bool:
        """Whether a call of m rows (at most a call's) runs moe_tiles."""
        many = self._many
        return many is not None and m * top_k >= many.from_rows * self._layer.struct.num_experts

    def _forward(self, x: torch.Tensor, ids: torch.Tensor, weights: torch.Tensor,
                 out: torch.Tensor) -> None:
        (m, top_k), threads, scratch = ids.shape, torch.get_num_threads(), _scratch()
        if self.runs_tiles(m, top_k):
            tiles = self._many.kernel  # type: ignore[union-attr]
            scratch.reserve(tiles.workspace_bytes(self._layer, m, top_k, threads))
            tiles.forward(self._layer, x, ids, weights, threads=threads, work=scratch.buffer,
                          out=out)
            return
        scratch.reserve(self._kernel.workspace_bytes(self._layer, m, top_k))
        self._kernel.forward(self._layer, x, ids, weights, threads=threads, work=scratch.buffer,
                             out=out)

    def c_experts(self, m: int, top_k: int) -> CExperts | None:
        """moe_forward and this layer's struct for a C caller's steps of m rows (one call,
        as apply makes one for them), or None where apply would slice them or run
        moe_tiles (which rounds otherwise)."""
        if m > ROWS_A_CALL or self.runs_tiles(m, top_k):
            return None
        return self._kernel.c_experts(self._layer, m, top_k)


def in_place_experts(experts: Sequence[ExpertWeightsLike], activation: str,
                     limit: float | None = None,
                     alpha: float | None = None) -> CpuExpertsMethod | None:
    """The kernel's method for these experts, or None where it does not serve them (the
    reason logged once per kind): experts that are not GGUF rows of a type it reads (a
    folder's float experts, a file's other types), an activation other than SiLU and gpt-oss's
    clamped SwiGLU, or no library."""
    why = _not_served(experts, activation)
    if why is not None:
        _log_once(why)
        return None
    kernel = _kernel()
    if kernel is None:
        return None
    projections = [
        Projection([getattr(e, name).blocks for e in experts], getattr(experts[0], name).type_name,
                   _biases(experts, f"{name}_bias"))
        for name in ("gate", "up", "down")]
    try:
        layer = kernel.layer(*projections, activation=activation, limit=limit or 0.0,
                             alpha=alpha or 0.0)
    except ValueError as exc:  # widths that are not whole blocks, gate and up unalike
        _log_once(f"the experts' blocks do not fit it ({exc})")
        return None
    return CpuExpertsMethod(kernel, layer, _many_rows(kernel, layer))


def _many_rows(kernel: MoeExperts, layer: MoeLayer) -> ManyRows | None:
    """moe_tiles for this layer from the rows an expert the calibration found it faster
    (once per layer shape, types and activation: a model's layers share them), or None where
    it does not read the layer or never wins."""
    tiles = _tiles_kernel()
    if tiles is None or not tiles.supports(layer, 1):
        return None
    s = layer.struct
    key = (s.hidden, s.inter, s.gate_type, s.up_type, s.down_type, s.activation)
    if key not in _calibrated:
        _calibrated[key] = calibrate_tiles(kernel, tiles, layer)
    from_rows = _calibrated[key]
    return None if from_rows == sys.maxsize else ManyRows(tiles, from_rows)


def calibrate_tiles(kernel: MoeExperts, tiles: MoeTiles, layer: MoeLayer) -> int:
    """From how many rows an expert moe_tiles beats moe_forward on this layer (sys.maxsize:
    never), timed with CALIBRATION_ROWS rows all routed to its first expert, on one thread:
    the kernels split their work alike, and a team's call on a busy machine waits for its
    slowest thread (a whole time slice where one was descheduled), which hid both kernels'
    times behind ~50 ms here."""
    threads = 1
    g = torch.Generator().manual_seed(0)
    calls = {}
    for r in CALIBRATION_ROWS:
        x = torch.randn(r, layer.hidden, generator=g)
        ids, weights = torch.zeros(r, 1, dtype=torch.int64), torch.ones(r, 1)
        calls[r] = (partial(kernel.forward, layer, x, ids, weights, threads=threads),
                    partial(tiles.forward, layer, x, ids, weights, threads=threads))
    from_rows, timings = second_wins_from(calls)
    table = ", ".join(f"{r} rows {a * 1e3:.2f} / {b * 1e3:.2f} ms"
                      for r, (a, b) in timings.items())
    logger.info("Mixture-of-experts layers (hidden %d, width %d): moe_tiles %s "
                "(moe_forward / moe_tiles, rows an expert: %s)", layer.hidden, layer.struct.inter,
                f"from {from_rows} rows an expert" if from_rows != sys.maxsize else "never",
                table)
    return from_rows


def _not_served(experts: Sequence[ExpertWeightsLike], activation: str) -> str | None:
    if activation not in ACTIVATIONS:
        return f"the experts' activation is {activation}"
    for name in ("gate", "up", "down"):
        weights = [getattr(e, name) for e in experts]
        if not all(isinstance(w, GGUFRows) for w in weights):
            return "the experts are not a GGUF file's rows read in place"
        kinds = {w.type_name for w in weights}
        if len(kinds) != 1 or not kinds <= BLOCKS.keys():
            return f"the experts' {name} blocks are {', '.join(sorted(kinds))}"
    return None


def _biases(experts: Sequence[ExpertWeightsLike], name: str) -> list[torch.Tensor] | None:
    biases = [getattr(e, name) for e in experts]
    return None if biases[0] is None else biases


@functools.cache
def _kernel() -> MoeExperts | None:
    lib = load_native("moe_experts")
    if lib is None:
        return None
    kernel = MoeExperts(lib)
    if kernel.best_isa() < _AVX2:
        logger.info("CPU kernel moe_experts runs its scalar fallback: this CPU lacks AVX2 and "
                    "FMA (slow, but the experts stay in the file's pages)")
    return kernel


@functools.cache
def _tiles_kernel() -> MoeTiles | None:
    lib = load_native("moe_tiles")
    return None if lib is None else MoeTiles(lib)


_calibrated: dict[tuple[int, ...], int] = {}


@functools.cache
def _log_once(why: str) -> None:
    logger.info("Mixture-of-experts layers run the grouped torch method, not moe_experts: %s",
                why)


_local = threading.local()


def _scratch() -> Scratch:
    scratch = getattr(_local, "scratch", None)
    if scratch is None:
        scratch = _local.scratch = Scratch()
    return scratch
