"""Build and call pagoda/kernels/cpu/q8_amx.c (q8_gemv's int8 pass on AMX tiles) through ctypes.

Built and loaded by `pagoda.kernels.cpu.native` (which binds it to torch's OpenMP runtime). It reads
q8_gemv's operand in place (`pagoda.kernels.cpu.q8_gemv`): q int8 [n, k], scales and optional mins
[n, k / 32] in fp16 or fp32.
"""

from __future__ import annotations

import ctypes
from pathlib import Path

import torch

from pagoda.kernels.cpu import native
from pagoda.kernels.cpu.q8_gemv import Q8Operand

NAME = "q8_amx"
BEST_ISA = -1


class Q8Amx:
    """The loaded library, with tensor-level calls. Tensors must be contiguous CPU ones."""

    def __init__(self, lib: ctypes.CDLL) -> None:
        self._lib = lib
        ptr, i32, size = ctypes.c_void_p, ctypes.c_int, ctypes.c_size_t
        signatures = {
            "q8a_available": ([], i32),
            "q8a_workspace_bytes": ([i32, i32], size),
            "q8a_linear": ([i32, ptr, ptr, ptr, i32, i32, i32, ptr, i32, ptr, ptr, i32], i32),
        }
        for name, (args, result) in signatures.items():
            fn = getattr(self._lib, name)
            fn.argtypes, fn.restype = args, result

    @classmethod
    def load(cls, build_dir: Path | None, compiler: str | None = None) -> Q8Amx:
        """Raises native.NativeBuildError where the library can be neither found nor built."""
        return cls(native.load(NAME, build_dir, compiler))

    @property
    def raw(self) -> ctypes.CDLL:
        """The library itself, its functions declared (see `Q4Gemv.raw`)."""
        return self._lib

    def available(self) -> bool:
        """Whether this CPU has AMX (with INT8) and the OS lets this process use its tiles."""
        return bool(self._lib.q8a_available())

    def workspace_bytes(self, m: int, k: int) -> int:
        return self._lib.q8a_workspace_bytes(m, k)

    def linear(self, w: Q8Operand, x: torch.Tensor, threads: int = 1) -> torch.Tensor:
        """y = x @ W.T with x quantized to int8 per block inside (q8_gemv's int8 pass)."""
        x = x.float().contiguous()
        m = x.shape[0]
        y = torch.empty(m, w.out_features)
        work = torch.empty(self.workspace_bytes(m, w.in_features) + 64, dtype=torch.uint8)
        rc = self._lib.q8a_linear(BEST_ISA, *w.pointers, w.out_features, w.in_features,
                                  x.data_ptr(), m, y.data_ptr(), work.data_ptr(), threads)
        if rc:
            raise ValueError("q8a_linear refused its arguments (k must be a multiple of 32, "
                             "shapes positive, no Q6_K blocks, and this CPU must have AMX)")
        return y
