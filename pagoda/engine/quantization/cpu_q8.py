"""Grouped int8 weights on the CPU through our own kernel, pagoda/kernels/cpu/q8_gemv.c, which reads the
engine's `Int8Weight` in place: GGUF's Q8_0 (the default model's tied vocabulary table) and the
types the loader widens to int8 (Q5_0, Q5_1, Q2_K, Q3_K, IQ*, MXFP4); and GGUF's Q6_K, IQ4_XS
and Q5_K blocks (`BlockWeight`: a Q4_K_M file's vocabulary and some of its v and down
projections; IQ4_XS and Q5_K_M files' layers), read in place at 0.82, 0.53 and 0.69 bytes a
weight.

Without it such a weight runs as two int4 halves (`split_int8`), 1.5 bytes a weight against
Q8_0's 1.06, and for a tied vocabulary a second copy beside the table the embedding lookup and
the exact top-logit refinement read. The vocabulary projection takes int8 activations (its top
logits are recomputed exactly, `pagoda.engine.layers.lm_head`), layers int16 ones (~16 bits), where the
load-time calibration chose this kernel for them (`cpu_paths.choose_int8_kernel`).

On a CPU with AMX the int8 pass's steps of many rows run on its tiles (pagoda/kernels/cpu/q8_amx.c:
the same operand read in place, the same quantized activations, their block products exact in
int32) from the step size the load-time timing finds it faster (`cpu_paths.choose_amx_rows`).
"""

from __future__ import annotations

import logging
import sys

import torch

from pagoda.engine.quantization import cpu_paths
from pagoda.engine.quantization.cpu_paths import CpuPathPolicy
from pagoda.engine.quantization.native_kernels import load_amx_kernel, load_native
from pagoda.engine.quantization.native_linear import NativeLinearKernel, Scratch, WideCall
from pagoda.engine.quantization.tensors import BlockWeight, Int8Weight
from pagoda.kernels.cpu.decode_layers import Q8_KIND, CLinear
from pagoda.kernels.cpu.q8_amx import Q8Amx
from pagoda.kernels.cpu.q8_gemv import SUPER_SCALED_TYPES, Q8Gemv

logger = logging.getLogger(__name__)

_AVX2 = 1


class Q8Context:
    """The loaded libraries (q8_amx where this CPU and its OS run AMX, else None) and one
    model's scratch memory for the quantized activations."""

    __slots__ = ("amx", "lib", "scratch")

    def __init__(self, lib: Q8Gemv, amx: Q8Amx | None = None) -> None:
        self.lib = lib
        self.amx = amx
        self.scratch = Scratch()

    def with_own_scratch(self) -> Q8Context:
        """The same libraries with scratch of its own (for a probe's calls)."""
        return Q8Context(self.lib, self.amx)


def load_q8_context() -> Q8Context | None:
    """q8_gemv where it can run well here, else None (grouped int8 runs as int4 halves): no
    library (`pagoda.engine.quantization.native_kernels`), or a CPU without AVX2, whose scalar path is slow."""
    lib = load_native("q8_gemv")
    if lib is None:
        return None
    q8 = Q8Gemv(lib)
    if q8.best_isa() < _AVX2:
        logger.info("CPU kernel q8_gemv not used: this CPU lacks AVX2 and FMA")
        return None
    return Q8Context(q8, load_amx_kernel("q8_amx", Q8Amx))


class Q8Kernel(NativeLinearKernel):
    """One grouped int8 weight multiplied on fp32 rows in place: `kernel(x)` = x @ W.T, its
    output reused as `NativeLinearKernel` describes. precise: int16 activations, else int8,
    whose steps of at least amx_from_rows rows run q8_amx where the context has it and the
    weight is not GGUF blocks (it times them at any count: `wide_kernel`)."""

    __slots__ = ("operand",)

    def __init__(self, weight: Int8Weight | BlockWeight, context: Q8Context, precise: bool,
                 reuse_output: bool, amx_from_rows: int = sys.maxsize) -> None:
        lib = context.lib
        self.operand = _operand(weight)
        call = lib.raw.q8_linear16 if precise else lib.raw.q8_linear
        workspace = lib.workspace16_bytes if precise else lib.workspace_bytes
        amx = None if precise or isinstance(weight, BlockWeight) else context.amx
        wide = None if amx is None else WideCall(amx.raw.q8a_linear, amx.workspace_bytes,
                                                 amx_from_rows)
        super().__init__("q8_gemv", call, (*self.operand.pointers, *weight.shape), weight.shape,
                         context.scratch, workspace, reuse_output, wide)

    def c_linear(self, rows: int) -> CLinear:
        """This kernel for callers in C (`pagoda.kernels.cpu.decode_layers`) at steps of `rows`."""
        q, scales, mins, halves = self.operand.pointers
        return CLinear(Q8_KIND, self._function_address(rows), q, self._n, self._k, halves,
                       scales, mins)


def _operand(weight: Int8Weight | BlockWeight):
    if isinstance(weight, BlockWeight):
        return Q8Gemv.blocks_operand(weight.blocks.contiguous(), weight.TYPE_NAME)
    mins = None if weight.mins is None else weight.mins.contiguous()
    return Q8Gemv.operand(weight.q.contiguous(), weight.scales.contiguous(), mins)


class CpuQ8Method:
    """A grouped int8 or GGUF blocks layer (or vocabulary) through q8_gemv; steps that dequantize
    (`cpu_paths`) widen the same weight, so it is the only copy kept."""

    __slots__ = ("native", "policy", "weight")

    def __init__(self, weight: Int8Weight | BlockWeight, policy: CpuPathPolicy,
                 context: Q8Context, precise: bool, reuse_output: bool) -> None:
        self.weight = weight
        self.policy = policy
        # IQ4_XS and Q5_K layers take int8 activations a scale per 256 values, as llama.cpp's
        # kernels for them do (Q8_K): their products then add up in int32 a super-block at a
        # time (pagoda/kernels/cpu/q8_gemv.c), and the weights' own rounding outweighs the
        # activations'.
        precise = precise and getattr(weight, "TYPE_NAME", None) not in SUPER_SCALED_TYPES
        self.native = Q8Kernel(weight, context, precise, reuse_output,
                               policy.int8_pass_amx_from_rows)

    def apply(self, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        return cpu_paths.apply(self, x, bias)

    def kernel(self, x: torch.Tensor) -> torch.Tensor:
        return self.native.kernel(x)

    def c_kernel(self, rows: int) -> Q8Kernel | None:
        """The kernel where it is what steps of `rows` rows run (for callers in C), else None."""
        threshold = self.policy.dequantize_from_rows
        return None if threshold is not None and rows >= threshold else self.native

    def dequantized(self, dtype: torch.dtype) -> torch.Tensor:
        return self.policy.workspace.dequantize(self.weight, dtype)
