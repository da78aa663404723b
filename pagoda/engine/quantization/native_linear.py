"""What our C linear kernels (q4_gemv, q8_gemv) share on the Python side: the scratch memory a
model's layers share, and a kernel object whose call does the least Python it can.

Such a call runs ~120 times a decode step (where the step is not one C call already,
pagoda/engine/models/native_decode.py), so the weight's arguments, shapes and output buffer are kept
from one call to the next, and the scratch is one buffer for all layers (a model is stepped by
one thread at a time).
"""

from __future__ import annotations

import ctypes
import sys
from collections.abc import Callable
from dataclasses import dataclass

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


@dataclass(frozen=True, slots=True)
class WideCall:
    """A second C function of the same arguments for steps of at least `from_rows` rows (a
    kernel built for many rows), with its own scratch size."""

    call: ctypes._CFuncPtr
    workspace_bytes: Callable[[int, int], int]
    from_rows: int = sys.maxsize


class NativeLinearKernel:
    """One weight multiplied on fp32 rows by a C function `call(isa, *args, x, m, y, work,
    threads)` (args: the weight's own arguments, ending in its n and k): `kernel(x)` = x @ W.T,
    through `wide.call` instead for steps of at least `wide.from_rows` rows.

    reuse_output: return the same buffer for every call of the same row count (up to
    REUSED_OUTPUT_ROWS); a result is then valid until this weight's next call, which holds for
    a layer inside the model, whose output is consumed before the next step, not for logits."""

    __slots__ = ("_args", "_call", "_k", "_n", "_name", "_narrow", "_out", "_out_ptr",
                 "_reuse", "_rows", "_scratch", "_wide")

    def __init__(self, name: str, call: ctypes._CFuncPtr, args: tuple, shape: tuple[int, int],
                 scratch: Scratch, workspace_bytes: Callable[[int, int], int],
                 reuse_output: bool, wide: WideCall | None = None) -> None:
        self._name = name
        self._narrow = (call, workspace_bytes)
        self._wide = wide
        self._call = call
        self._args = args
        self._n, self._k = shape
        self._scratch = scratch
        self._reuse = reuse_output
        self._rows = -1
        self._out: torch.Tensor | None = None
        self._out_ptr = 0

    @property
    def has_wide_call(self) -> bool:
        return self._wide is not None

    def wide_kernel(self, x: torch.Tensor) -> torch.Tensor:
        """x @ W.T through the wide call whatever the row count (to time it against the
        other), in a new tensor; ValueError where there is none."""
        wide = self._wide
        if wide is None:
            raise ValueError(f"{self._name} has no kernel for many rows here")
        x = self._fitting(x)
        m = x.shape[0]
        self._scratch.reserve(wide.workspace_bytes(m, self._k))
        out = torch.empty(m, self._n)
        self._check(wide.call(-1, *self._args, x.data_ptr(), m, out.data_ptr(),
                              self._scratch.ptr, torch.get_num_threads()), m)
        return out

    def kernel(self, x: torch.Tensor) -> torch.Tensor:
        x = self._fitting(x)
        m = x.shape[0]
        if not m:  # a step where no row samples: the kernel takes no empty inputs
            return x.new_empty(0, self._n)
        if m != self._rows:
            self._prepare(m)
        out = self._out
        if out is None:
            out = torch.empty(m, self._n)
            out_ptr = out.data_ptr()
        else:
            out_ptr = self._out_ptr
        self._check(self._call(-1, *self._args, x.data_ptr(), m, out_ptr, self._scratch.ptr,
                               torch.get_num_threads()), m)
        return out

    def _fitting(self, x: torch.Tensor) -> torch.Tensor:
        """x as the C functions read it (m x k contiguous floats), or ValueError: anything
        else would be read past or misread."""
        if x.dim() != 2 or x.shape[1] != self._k or x.dtype != torch.float32:
            raise ValueError(f"{self._name} takes float32 [rows, {self._k}] inputs for its "
                             f"[{self._n}, {self._k}] weight, got {x.dtype} "
                             f"{list(x.shape)}")
        return x if x.is_contiguous() else x.contiguous()

    def _check(self, rc: int, m: int) -> None:
        if rc:
            raise ValueError(f"{self._name} refused a [{m}, {self._k}] input for a "
                             f"[{self._n}, {self._k}] weight")

    def workspace_bytes(self, m: int) -> int:
        return self._call_for(m)[1](m, self._k)

    def _function_address(self, rows: int) -> int:
        """The C function that steps of `rows` run, for callers in C."""
        return ctypes.cast(self._call_for(rows)[0], ctypes.c_void_p).value

    def _call_for(self, m: int) -> tuple[ctypes._CFuncPtr, Callable[[int, int], int]]:
        wide = self._wide
        if wide is not None and m >= wide.from_rows:
            return wide.call, wide.workspace_bytes
        return self._narrow

    def _prepare(self, m: int) -> None:
        """The C function, scratch and (for decode-sized steps) the output buffer for steps
        of m rows."""
        self._rows = m
        self._call, workspace_bytes = self._call_for(m)
        self._scratch.reserve(workspace_bytes(m, self._k))
        if self._reuse and m <= REUSED_OUTPUT_ROWS:
            self._out = torch.empty(m, self._n)
            self._out_ptr = self._out.data_ptr()
        else:
            self._out, self._out_ptr = None, 0
