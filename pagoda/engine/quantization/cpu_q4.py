"""int4 weights on the CPU through our own kernel, pagoda/kernels/cpu/q4_gemv.c: activations quantized
per block of 32 inside the call, integer dot products against the 4-bit weights.

Two precisions of it (docs/KERNELS.md): int8 activations gave 97.0% top-1 agreement on the
default model, enough only for the vocabulary projection, whose top logits are recomputed
exactly afterwards (`pagoda.engine.layers.lm_head`); the layers take int16 activations (~16 bits, as
close as the split int8 pass that gave 100%, at about one int8 pass's cost).

On a CPU with AMX (pagoda/kernels/cpu/q4_amx.c) the layers' steps of many rows run on its tiles
instead, from the step size the load-time calibration finds it faster (`cpu_paths`): the same
records, activations as two bf16 parts (~16 bits).

A call's Python is `pagoda.engine.quantization.native_linear`'s, shared with q8_gemv's layers.
"""

from __future__ import annotations

import logging
import sys

import torch

from pagoda.engine.quantization.native_kernels import load_amx_kernel, load_native
from pagoda.engine.quantization.native_linear import NativeLinearKernel, Scratch, WideCall
from pagoda.engine.quantization.tensors import Int4Weight, k_quant_scales, with_compact_scales
from pagoda.kernels.cpu.decode_layers import Q4_KIND, CLinear
from pagoda.kernels.cpu.q4_amx import Q4Amx
from pagoda.kernels.cpu.q4_gemv import Q4Gemv, Q4Repacked

logger = logging.getLogger(__name__)

_AVX2 = 1


class Q4Context:
    """The loaded libraries (q4_amx where this CPU and its OS run AMX, else None) and one
    model's scratch memory."""

    __slots__ = ("amx", "lib", "scratch")

    def __init__(self, lib: Q4Gemv, amx: Q4Amx | None = None) -> None:
        self.lib = lib
        self.amx = amx
        self.scratch = Scratch()

    def with_own_scratch(self) -> Q4Context:
        """The same libraries with scratch of its own (a probe's large calls leave the
        model's scratch decode-sized)."""
        return Q4Context(self.lib, self.amx)


def load_q4_context() -> Q4Context | None:
    """q4_gemv where it can run well here, else None (and torch's int4 kernel runs): no
    library (`pagoda.engine.quantization.native_kernels`), or a CPU without AVX2 (and FMA, F16C), whose scalar path is
    slower than torch's. With it, q4_amx where it runs here."""
    lib = load_native("q4_gemv")
    if lib is None:
        return None
    q4 = Q4Gemv(lib)
    if q4.best_isa() < _AVX2:
        logger.info("CPU kernel q4_gemv not used: this CPU lacks AVX2, FMA or F16C")
        return None
    return Q4Context(q4, load_amx_kernel("q4_amx", Q4Amx))


def repack(lib: Q4Gemv, weight: Int4Weight) -> Q4Repacked:
    """The weight in q4_gemv's layout, its records in the smallest format that holds it
    exactly: fp16 scales and mins (0.625 bytes a weight: Q4_0, Q4_1), Q4_K's own six-bit
    sub-block scales (0.578: Q4_K), else fp32 (0.75). A one-row step reads every byte once, so
    fewer bytes is less time where memory bounds it; the products are the same."""
    compact = with_compact_scales(weight)
    if compact.scales.dtype == compact.mins.dtype == torch.float16:
        return lib.repack(compact.packed, compact.scales, compact.mins)
    kq = k_quant_scales(weight)
    if kq is not None:
        return lib.repack_kq(weight.packed, kq.d, kq.dmin, kq.sc, kq.m)
    return lib.repack(weight.packed, weight.scales, weight.mins)


class Q4Kernel(NativeLinearKernel):
    """One int4 weight in q4_gemv's layout, multiplied on fp32 rows: `kernel(x)` = x @ W.T,
    its output reused as `NativeLinearKernel` describes."""

    __slots__ = ("_record_format", "_weight_ptr", "precise", "repacked")

    def __init__(self, weight: Int4Weight, context: Q4Context, precise: bool,
                 reuse_output: bool, amx_from_rows: int = sys.maxsize) -> None:
        """precise: int16 activations, else int8 ones; precise steps of at least amx_from_rows
        rows run q4_amx where the context has it (it times them at any count: `wide_kernel`).
        The records are the smallest format that holds the weight exactly (`repack`)."""
        lib = context.lib
        self.repacked = repack(lib, weight)
        self.precise = precise
        self._weight_ptr = self.repacked.data.data_ptr()
        self._record_format = self.repacked.record_format
        call = lib.raw.q4_linear16 if precise else lib.raw.q4_linear
        workspace = lib.workspace16_bytes if precise else lib.workspace_bytes
        amx = context.amx if precise else None
        wide = None if amx is None else WideCall(amx.raw.q4a_linear, amx.workspace_bytes,
                                                 amx_from_rows)
        super().__init__("q4_gemv", call, (self._weight_ptr, self._record_format, *weight.shape),
                         weight.shape, context.scratch, workspace, reuse_output, wide)

    def c_linear(self, rows: int) -> CLinear:
        """This kernel for callers in C (`pagoda.kernels.cpu.decode_layers`) at steps of `rows`: the
        function those steps run (q4_amx's takes q4_gemv's arguments)."""
        return CLinear(Q4_KIND, self._function_address(rows), self._weight_ptr, self._n,
                       self._k, self._record_format)
