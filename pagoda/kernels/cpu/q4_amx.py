"""Build and call pagoda/kernels/cpu/q4_amx.c (q4_gemv's int4 records times fp32 rows on AMX tiles)
through ctypes.

Built and loaded by `pagoda.kernels.cpu.native` (which binds it to torch's OpenMP runtime). Its
weights are q4_gemv's repacked ones (`pagoda.kernels.cpu.q4_gemv.Q4Repacked`).
"""

from __future__ import annotations

import ctypes
from pathlib import Path

import torch

from pagoda.kernels.cpu import native
from pagoda.kernels.cpu.q4_gemv import Q4Repacked

NAME = "q4_amx"
BEST_ISA = -1


class Q4Amx:
    """The loaded library, with tensor-level calls. Tensors must be contiguous CPU ones."""

    def __init__(self, lib: ctypes.CDLL) -> None:
        self._lib = lib
        ptr, i32, size = ctypes.c_void_p, ctypes.c_int, ctypes.c_size_t
        signatures = {
            "q4a_available": ([], i32),
            "q4a_workspace_bytes": ([i32, i32], size),
            "q4a_linear": ([i32, ptr, i32, i32, i32, ptr, i32, ptr, ptr, i32], i32),
        }
        for name, (args, result) in signatures.items():
            fn = getattr(self._lib, name)
            fn.argtypes, fn.restype = args, result

    @classmethod
    def load(cls, build_dir: Path | None, compiler: str | None = None) -> Q4Amx:
        """Raises native.NativeBuildError where the library can be neither found nor built."""
        return cls(native.load(NAME, build_dir, compiler))

    @property
    def raw(self) -> ctypes.CDLL:
        """The library itself, its functions declared (see `Q4Gemv.raw`)."""
        return self._lib

    def available(self) -> bool:
        """Whether this CPU has AMX with BF16 and the OS lets this process use its tiles."""
        return bool(self._lib.q4a_available())

    def workspace_bytes(self, m: int, k: int) -> int:
        return self._lib.q4a_workspace_bytes(m, k)

    def linear(self, w: Q4Repacked, x: torch.Tensor, threads: int = 1) -> torch.Tensor:
        """y = x @ W.T, x rounded to a bf16 high and low part inside (~16 bits of it)."""
        x = x.float().contiguous()
        m = x.shape[0]
        y = torch.empty(m, w.out_features)
        work = torch.empty(self.workspace_bytes(m, w.in_features) + 64, dtype=torch.uint8)
        rc = self._lib.q4a_linear(BEST_ISA, w.data.data_ptr(), w.record_format, w.out_features,
                                  w.in_features, x.data_ptr(), m, y.data_ptr(), work.data_ptr(),
                                  threads)
        if rc:
            raise ValueError("q4a_linear refused its arguments (k must be a multiple of 32, "
                             "shapes positive, and this CPU must have AMX with BF16)")
        return y
