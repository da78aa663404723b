"""A mixture-of-experts layer's routed experts on the CPU through our own kernel,
kernels/cpu/moe_experts.c: the experts' GGUF blocks read where the file's memory map holds them
(`GGUFRows`, engine/quantization/expert_weights.py), one C call a layer and step, each active
expert's weights read once for all the rows routed to it.

`in_place_experts` is what `engine.layers.moe.experts_method_for` asks first on a CPU; it
answers None (and the layer's default method runs, on the experts' decoded copies) where the
experts are not GGUF rows of types the kernel reads, the activation is another, or the library
cannot be built here.
"""

from __future__ import annotations

import functools
import logging
import threading
from collections.abc import Sequence
from typing import Protocol

import torch

from engine.quantization.native_kernels import load_native
from engine.quantization.native_linear import Scratch
from engine.quantization.tensors import GGUFRows, Weight
from kernels.cpu.moe_experts import (
    ACTIVATIONS,
    BLOCKS,
    CExperts,
    MoeExperts,
    MoeLayer,
    Projection,
)

logger = logging.getLogger(__name__)

_AVX2 = 1
# Rows a kernel call takes at most: a prefill chunk goes in slices, which bounds the scratch
# (an intermediate and an output row for each of a row's k experts: ~16 MB at 256 rows of
# Qwen3-30B-A3B, where 2,048 rows took 130) and changes no row's result (a row's output does
# not depend on its company). Each slice still reads an expert once for all its rows routed to
# it (~16 of 256 at 8 of 128 experts).
ROWS_A_CALL = 256


class ExpertWeightsLike(Protocol):
    """One expert's weights (engine.layers.moe.ExpertWeights)."""

    gate: Weight
    up: Weight
    down: Weight
    gate_bias: torch.Tensor | None
    up_bias: torch.Tensor | None
    down_bias: torch.Tensor | None


class CpuExpertsMethod:
    """`ExpertsMethod` of a layer whose experts moe_experts reads in place. The quantized
    activations' scratch is one per thread, shared by every layer (a model is stepped by one
    thread at a time)."""

    __slots__ = ("_kernel", "_layer")

    def __init__(self, kernel: MoeExperts, layer: MoeLayer) -> None:
        self._kernel = kernel
        self._layer = layer

    def apply(self, x: torch.Tensor, topk_weights: torch.Tensor,
              topk_ids: torch.Tensor) -> torch.Tensor:
        rows = x.float().contiguous()
        ids = topk_ids.to(torch.int64).contiguous()
        weights = topk_weights.float().contiguous()
        m = rows.shape[0]
        scratch = _scratch()
        scratch.reserve(self._kernel.workspace_bytes(self._layer, min(m, ROWS_A_CALL),
                                                     ids.shape[1]))
        out = torch.empty(m, rows.shape[1])
        for start in range(0, m, ROWS_A_CALL):
            part = slice(start, start + ROWS_A_CALL)
            self._kernel.forward(self._layer, rows[part], ids[part], weights[part],
                                 threads=torch.get_num_threads(), work=scratch.buffer,
                                 out=out[part])
        return out if x.dtype == torch.float32 else out.to(x.dtype)

    def c_experts(self, m: int, top_k: int) -> CExperts | None:
        """moe_forward and this layer's struct for a C caller's steps of m rows (one call,
        as apply makes one for them), or None where apply would slice them."""
        if m > ROWS_A_CALL:
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
    return CpuExpertsMethod(kernel, layer)


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
def _log_once(why: str) -> None:
    logger.info("Mixture-of-experts layers run the grouped torch method, not moe_experts: %s",
                why)


_local = threading.local()


def _scratch() -> Scratch:
    scratch = getattr(_local, "scratch", None)
    if scratch is None:
        scratch = _local.scratch = Scratch()
    return scratch
