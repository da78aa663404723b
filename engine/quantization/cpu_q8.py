"""Grouped int8 weights on the CPU through our own kernel, kernels/cpu/q8_gemv.c, which reads the
engine's `Int8Weight` in place: GGUF's Q8_0 (the default model's tied vocabulary table) and the
formats the loader widens to int8 (Q5_0, Q5_1, Q5_K, Q6_K).

Without it such a weight runs as two int4 halves (`split_int8`), 1.5 bytes a weight against
Q8_0's 1.06, and for a tied vocabulary a second copy beside the table the embedding lookup and
the exact top-logit refinement read. The vocabulary projection takes int8 activations (its top
logits are recomputed exactly, `engine.layers.lm_head`), layers int16 ones (~16 bits), where the
load-time calibration chose this kernel for them (`cpu_paths.choose_int8_kernel`).
"""

from __future__ import annotations

import ctypes
import logging

import torch

from engine.native_kernels import load_native
from engine.quantization import cpu_paths
from engine.quantization.cpu_paths import CpuPathPolicy
from engine.quantization.cpu_q4 import REUSED_OUTPUT_ROWS, Q4Scratch
from engine.quantization.tensors import Int8Weight
from kernels.cpu.decode_layers import Q8_KIND, CLinear
from kernels.cpu.q8_gemv import Q8Gemv

logger = logging.getLogger(__name__)

_AVX2 = 1


class Q8Context:
    """The loaded library and one model's scratch memory for the quantized activations."""

    __slots__ = ("lib", "scratch")

    def __init__(self, lib: Q8Gemv) -> None:
        self.lib = lib
        self.scratch = Q4Scratch()


def load_q8_context() -> Q8Context | None:
    """q8_gemv where it can run well here, else None (grouped int8 runs as int4 halves): no
    library (`engine.native_kernels`), or a CPU without AVX2, whose scalar path is slow."""
    lib = load_native("q8_gemv")
    if lib is None:
        return None
    q8 = Q8Gemv(lib)
    if q8.best_isa() < _AVX2:
        logger.info("CPU kernel q8_gemv not used: this CPU lacks AVX2 and FMA")
        return None
    return Q8Context(q8)


class Q8Kernel:
    """One grouped int8 weight multiplied on fp32 rows in place: `kernel(x)` = x @ W.T.

    precise: int16 activations, else int8 ones. reuse_output: as `cpu_q4.Q4Kernel`'s (a
    result valid until this weight's next call: a layer's, not logits)."""

    __slots__ = ("_args", "_call", "_context", "_k", "_n", "_out", "_out_ptr", "_reuse",
                 "_rows", "_workspace_bytes", "operand")

    def __init__(self, weight: Int8Weight, context: Q8Context, precise: bool,
                 reuse_output: bool) -> None:
        lib = context.lib
        mins = None if weight.mins is None else weight.mins.contiguous()
        self.operand = lib.operand(weight.q.contiguous(), weight.scales.contiguous(), mins)
        self._context = context
        self._n, self._k = weight.shape
        self._args = (*self.operand.pointers, self._n, self._k)
        self._call = lib.raw.q8_linear16 if precise else lib.raw.q8_linear
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
        rc = self._call(-1, *self._args, x.data_ptr(), m, out_ptr, self._context.scratch.ptr,
                        torch.get_num_threads())
        if rc:
            raise ValueError(f"q8_gemv refused a [{m}, {self._k}] input for a "
                             f"[{self._n}, {self._k}] weight")
        return out

    def c_linear(self) -> CLinear:
        """This kernel for callers in C (`kernels.cpu.decode_layers`)."""
        q, scales, mins, halves = self.operand.pointers
        return CLinear(Q8_KIND, ctypes.cast(self._call, ctypes.c_void_p).value, q, self._n,
                       self._k, halves, scales, mins)

    def workspace_bytes(self, m: int) -> int:
        return self._workspace_bytes(m, self._k)

    def _prepare(self, m: int) -> None:
        self._rows = m
        self._context.scratch.reserve(self._workspace_bytes(m, self._k))
        if self._reuse and m <= REUSED_OUTPUT_ROWS:
            self._out = torch.empty(m, self._n)
            self._out_ptr = self._out.data_ptr()
        else:
            self._out, self._out_ptr = None, 0


class CpuQ8Method:
    """A grouped int8 layer (or vocabulary) through q8_gemv; steps that dequantize
    (`cpu_paths`) widen the same Int8Weight, so it is the only copy kept."""

    __slots__ = ("native", "policy", "weight")

    def __init__(self, weight: Int8Weight, policy: CpuPathPolicy, context: Q8Context,
                 precise: bool, reuse_output: bool) -> None:
        self.weight = weight
        self.policy = policy
        self.native = Q8Kernel(weight, context, precise, reuse_output)

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
