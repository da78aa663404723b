"""What our C linear kernels (q4_gemv, q8_gemv) share on the Python side: the scratch memory a
model's layers share, and a kernel object whose call does the least Python it can.

Such a call runs ~120 times a decode step (where the step is not one C call already,
engine/models/native_decode.py), so the weight's arguments, shapes and output buffer are kept
from one call to the next, and the scratch is one buffer for all layers (a model is stepped by
one thread at a time).
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable

import torch

# A layer keeps its output buffer for steps of up to this many rows (decode steps): 30 layers
# of the default model hold ~5 MB at 8, where prefill chunks' outputs would hold hundreds.
REUSED_OUTPUT_ROWS = 8


class Scratch:
    """Scratch memory for a kernel's quantized activations, grown to the largest call."""

    __slots__ = ("buffer", "ptr")

    def __init__(self) -> None:
        self.buffer = torch.empty(0, dtype=torch.uint8)
        self.ptr = self.buffer.data_ptr()

    def reserve(self, nbytes: int) -> None:
        if nbytes > self.buffer.numel():
            # 64-byte aligned for the vector loads; float32 elements keep it 4-byte aligned.
            self.buffer = torch.empty(nbytes + 64, dtype=torch.uint8)
            self.ptr = self.buffer.data_ptr() + (-self.buffer.data_ptr() % 64)


class NativeLinearKernel:
    """One weight multiplied on fp32 rows by a C function `call(isa, *args, x, m, y, work,
    threads)` (args: the weight's own arguments, ending in its n and k): `kernel(x)` = x @ W.T.

    reuse_output: return the same buffer for every call of the same row count (up to
    REUSED_OUTPUT_ROWS); a result is then valid until this weight's next call, which holds for
    a layer inside the model, whose output is consumed before the next step, not for logits."""

    __slots__ = ("_args", "_call", "_k", "_n", "_name", "_out", "_out_ptr", "_reuse", "_rows",
                 "_scratch", "_workspace_bytes")

    def __init__(self, name: str, call: ctypes._CFuncPtr, args: tuple, shape: tuple[int, int],
                 scratch: Scratch, workspace_bytes: Callable[[int, int], int],
                 reuse_output: bool) -> None:
        self._name = name
        self._call = call
        self._args = args
        self._n, self._k = shape
        self._scratch = scratch
        self._workspace_bytes = workspace_bytes
        self._reuse = reuse_output
        self._rows = -1
        self._out: torch.Tensor | None = None
        self._out_ptr = 0

    def kernel(self, x: torch.Tensor) -> torch.Tensor:
        m = x.shape[0]
        if x.dim() != 2 or x.shape[1] != self._k or x.dtype != torch.float32:
            # The C function reads m x k floats from x: anything else would be read past.
            raise ValueError(f"{self._name} takes float32 [rows, {self._k}] inputs for its "
                             f"[{self._n}, {self._k}] weight, got {x.dtype} "
                             f"{list(x.shape)}")
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
        rc = self._call(-1, *self._args, x.data_ptr(), m, out_ptr, self._scratch.ptr,
                        torch.get_num_threads())
        if rc:
            raise ValueError(f"{self._name} refused a [{m}, {self._k}] input for a "
                             f"[{self._n}, {self._k}] weight")
        return out

    def workspace_bytes(self, m: int) -> int:
        return self._workspace_bytes(m, self._k)

    def _function_address(self) -> int:
        return ctypes.cast(self._call, ctypes.c_void_p).value

    def _prepare(self, m: int) -> None:
        """Scratch and (for decode-sized steps) the output buffer for steps of m rows."""
        self._rows = m
        self._scratch.reserve(self._workspace_bytes(m, self._k))
        if self._reuse and m <= REUSED_OUTPUT_ROWS:
            self._out = torch.empty(m, self._n)
            self._out_ptr = self._out.data_ptr()
        else:
            self._out, self._out_ptr = None, 0
