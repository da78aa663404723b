"""int4 weights on the CPU through our own kernel, kernels/cpu/q4_gemv.c: activations quantized
per block of 32 inside the call, integer dot products against the 4-bit weights.

Two precisions of it (docs/KERNELS.md): int8 activations gave 97.0% top-1 agreement on the
default model, enough only for the vocabulary projection, whose top logits are recomputed
exactly afterwards (`engine.layers.lm_head`); the layers take int16 activations (~16 bits, as
close as the split int8 pass that gave 100%, at about one int8 pass's cost).

It runs 121 times a decode step, so a call does the least Python it can: the weight's address,
shapes and output buffer are kept from one call to the next, and the scratch memory is one
buffer shared by a model's layers (a model is stepped by one thread at a time).
"""

from __future__ import annotations

import ctypes
import logging

import torch

from engine.native_kernels import load_native
from engine.quantization.tensors import Int4Weight, with_compact_scales
from kernels.cpu.decode_layers import Q4_KIND, CLinear
from kernels.cpu.q4_gemv import Q4Gemv

logger = logging.getLogger(__name__)

_AVX2 = 1
# A layer keeps its output buffer for steps of up to this many rows (decode steps): 30 layers
# of the default model hold ~5 MB at 8, where prefill chunks' outputs would hold hundreds.
REUSED_OUTPUT_ROWS = 8


class Q4Scratch:
    """Scratch memory for the kernel's quantized activations, grown to the largest call."""

    __slots__ = ("buffer", "ptr")

    def __init__(self) -> None:
        self.buffer = torch.empty(0, dtype=torch.uint8)
        self.ptr = self.buffer.data_ptr()

    def reserve(self, nbytes: int) -> None:
        if nbytes > self.buffer.numel():
            # 64-byte aligned for the vector loads; float32 elements keep it 4-byte aligned.
            self.buffer = torch.empty(nbytes + 64, dtype=torch.uint8)
            self.ptr = self.buffer.data_ptr() + (-self.buffer.data_ptr() % 64)


class Q4Context:
    """The loaded library and one model's scratch memory."""

    __slots__ = ("lib", "scratch")

    def __init__(self, lib: Q4Gemv) -> None:
        self.lib = lib
        self.scratch = Q4Scratch()


def load_q4_context() -> Q4Context | None:
    """q4_gemv where it can run well here, else None (and torch's int4 kernel runs): no
    library (`engine.native_kernels`), or a CPU without AVX2 (and FMA, F16C), whose scalar path is
    slower than torch's."""
    lib = load_native("q4_gemv")
    if lib is None:
        return None
    q4 = Q4Gemv(lib)
    if q4.best_isa() < _AVX2:
        logger.info("CPU kernel q4_gemv not used: this CPU lacks AVX2, FMA or F16C")
        return None
    return Q4Context(q4)


class Q4Kernel:
    """One int4 weight in q4_gemv's layout, multiplied on fp32 rows: `kernel(x)` = x @ W.T.

    reuse_output: return the same buffer for every call of the same row count (up to
    REUSED_OUTPUT_ROWS); a result is then valid until this weight's next call, which holds for
    a layer inside the model, whose output is consumed before the next step, not for logits."""

    __slots__ = ("_call", "_compact", "_context", "_k", "_n", "_out", "_out_ptr", "_reuse",
                 "_rows", "_weight_ptr", "_workspace_bytes", "precise", "repacked")

    def __init__(self, weight: Int4Weight, context: Q4Context, precise: bool,
                 reuse_output: bool) -> None:
        """precise: int16 activations, else int8 ones. The weight's records are compact
        (fp16 scales and mins, 17% fewer bytes to read a step) where fp16 holds them exactly:
        Q4_0 and Q4_1 layers, not Q4_K ones."""
        lib = context.lib
        compact = with_compact_scales(weight)
        self.repacked = lib.repack(compact.packed, compact.scales, compact.mins)
        self.precise = precise
        self._context = context
        self._n, self._k = weight.shape
        self._weight_ptr = self.repacked.data.data_ptr()
        self._compact = int(self.repacked.compact)
        self._call = lib.raw.q4_linear16 if precise else lib.raw.q4_linear
        self._workspace_bytes = lib.workspace16_bytes if precise else lib.workspace_bytes
        self._reuse = reuse_output
        self._rows = -1
        self._out: torch.Tensor | None = None
        self._out_ptr = 0

    def kernel(self, x: torch.Tensor) -> torch.Tensor:
        m = x.shape[0]
        if not m:  # a step where no row samples: the kernel takes no empty inputs
            return x.new_empty(0, self._n)
        if m != self._rows:
            self._prepare(m)
        if not x.is_contiguous():
            x = x.contiguous()
        out = self._out
        if out is None:
            out = torch.empty(m, self._n)
            out_ptr = out.data_ptr()
        else:
            out_ptr = self._out_ptr
        rc = self._call(-1, self._weight_ptr, self._compact, self._n, self._k, x.data_ptr(), m,
                        out_ptr, self._context.scratch.ptr, torch.get_num_threads())
        if rc:
            raise ValueError(f"q4_gemv refused a [{m}, {self._k}] input for a "
                             f"[{self._n}, {self._k}] weight")
        return out

    def c_linear(self) -> CLinear:
        """This kernel for callers in C (`kernels.cpu.decode_layers`)."""
        return CLinear(Q4_KIND, ctypes.cast(self._call, ctypes.c_void_p).value, self._weight_ptr,
                       self._n, self._k, self._compact)

    def workspace_bytes(self, m: int) -> int:
        return self._workspace_bytes(m, self._k)

    def _prepare(self, m: int) -> None:
        """Scratch and (for decode-sized steps) the output buffer for steps of m rows."""
        self._rows = m
        self._context.scratch.reserve(self._workspace_bytes(m, self._k))
        if self._reuse and m <= REUSED_OUTPUT_ROWS:
            self._out = torch.empty(m, self._n)
            self._out_ptr = self._out.data_ptr()
        else:
            self._out, self._out_ptr = None, 0
