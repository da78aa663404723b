"""Build and call kernels/cpu/q4_gemv.c (int8 activations x int4 weights) through ctypes.

A prototype for measurement (issue 26, item 3): the engine does not use it. The library is
compiled with -fopenmp but linked without libgomp, and torch's own OpenMP runtime is made
global before it loads, so its parallel regions run on torch's thread team instead of a second
runtime's team fighting torch's for the same cores.
"""

from __future__ import annotations

import ctypes
import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

import torch

from engine.quantization.tensors import Int4Weight

SOURCE = Path(__file__).with_name("q4_gemv.c")
ISA_NAMES = {0: "scalar", 1: "avx2", 2: "avx512-vnni"}
BEST_ISA = -1

_COMPILE_FLAGS = ("-O3", "-march=x86-64-v2", "-fopenmp", "-fPIC")


class Q4BuildError(RuntimeError):
    """The C kernel could not be compiled or loaded."""


@dataclass(slots=True, frozen=True)
class Q4Repacked:
    """A weight in the kernel's tiled layout (uint8), for out_features x in_features."""

    data: torch.Tensor
    out_features: int
    in_features: int


def find_compiler() -> str | None:
    return os.environ.get("CC") or shutil.which("gcc") or shutil.which("cc")


def build(out_dir: Path, compiler: str | None = None) -> Path:
    """Compile and link q4_gemv.c into out_dir/libq4_gemv.so; returns its path."""
    compiler = compiler or find_compiler()
    if compiler is None:
        raise Q4BuildError("no C compiler found: install gcc or set CC")
    out_dir.mkdir(parents=True, exist_ok=True)
    obj, lib = out_dir / "q4_gemv.o", out_dir / "libq4_gemv.so"
    # Two steps: -fopenmp at link time would add -lgomp, i.e. the system's runtime.
    for cmd in ([compiler, *_COMPILE_FLAGS, "-c", str(SOURCE), "-o", str(obj)],
                [compiler, "-shared", str(obj), "-o", str(lib), "-lm"]):
        done = subprocess.run(cmd, check=False, capture_output=True, text=True)
        if done.returncode:
            raise Q4BuildError(f"{' '.join(cmd)} failed:\n{done.stderr}")
    return lib


def torch_openmp_runtime() -> Path:
    return Path(torch.__file__).parent / "lib" / "libgomp.so.1"


def mapped_openmp_runtimes() -> set[str]:
    """Paths of the OpenMP runtimes mapped into this process (one is what we want)."""
    with open("/proc/self/maps") as maps:
        paths = {line.split()[-1] for line in maps if len(line.split()) >= 6}
    return {p for p in paths if any(name in Path(p).name for name in ("libgomp", "libiomp", "libomp"))}


class Q4Gemv:
    """The loaded library, with tensor-level calls. Tensors must be contiguous CPU ones."""

    def __init__(self, lib_path: Path) -> None:
        runtime = torch_openmp_runtime()
        if not runtime.exists():
            raise Q4BuildError(f"torch's OpenMP runtime is not at {runtime}")
        ctypes.CDLL(str(runtime), mode=ctypes.RTLD_GLOBAL)
        self._lib = ctypes.CDLL(str(lib_path))
        self._declare()

    def _declare(self) -> None:
        ptr, i32, size = ctypes.c_void_p, ctypes.c_int, ctypes.c_size_t
        signatures = {
            "q4_best_isa": ([], i32),
            "q4_isa_supported": ([i32], i32),
            "q4_repacked_bytes": ([i32, i32], size),
            "q4_workspace_bytes": ([i32, i32], size),
            "q4_repack": ([ptr, ptr, ptr, i32, i32, ptr], i32),
            "q4_quantize_rows": ([i32, ptr, i32, i32, ptr, ptr, ptr], i32),
            "q4_gemm": ([i32, ptr, i32, i32, ptr, ptr, ptr, i32, ptr, i32], i32),
            "q4_linear": ([i32, ptr, i32, i32, ptr, i32, ptr, ptr, i32], i32),
            "q4_split_workspace_bytes": ([i32, i32, i32], size),
            "q4_linear_split": ([i32, ptr, i32, i32, ptr, i32, ptr, ptr, i32], i32),
        }
        for name, (args, result) in signatures.items():
            fn = getattr(self._lib, name)
            fn.argtypes, fn.restype = args, result

    def best_isa(self) -> int:
        return self._lib.q4_best_isa()

    def isa_supported(self, isa: int) -> bool:
        return bool(self._lib.q4_isa_supported(isa))

    def repack(self, weight: Int4Weight) -> Q4Repacked:
        n, k = weight.shape
        packed = weight.packed.contiguous()
        scales, mins = weight.scales.float().contiguous(), weight.mins.float().contiguous()
        out = torch.empty(self._lib.q4_repacked_bytes(n, k), dtype=torch.uint8)
        self._check(self._lib.q4_repack(packed.data_ptr(), scales.data_ptr(), mins.data_ptr(),
                                        n, k, out.data_ptr()), "q4_repack")
        return Q4Repacked(out, n, k)

    def quantize_rows(self, x: torch.Tensor, isa: int = BEST_ISA,
                      ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """fp32 [m, k] -> int8 [m, k], scales and sums fp32 [m, k / 32]."""
        x = x.float().contiguous()
        m, k = x.shape
        xq = torch.empty(m, k, dtype=torch.int8)
        scale, total = torch.empty(m, k // 32), torch.empty(m, k // 32)
        self._check(self._lib.q4_quantize_rows(isa, x.data_ptr(), m, k, xq.data_ptr(),
                                               scale.data_ptr(), total.data_ptr()),
                    "q4_quantize_rows")
        return xq, scale, total

    def gemm(self, w: Q4Repacked, xq: torch.Tensor, scale: torch.Tensor, total: torch.Tensor,
             isa: int = BEST_ISA, threads: int = 1) -> torch.Tensor:
        m = xq.shape[0]
        y = torch.empty(m, w.out_features)
        self._check(self._lib.q4_gemm(isa, w.data.data_ptr(), w.out_features, w.in_features,
                                      xq.data_ptr(), scale.data_ptr(), total.data_ptr(), m,
                                      y.data_ptr(), threads), "q4_gemm")
        return y

    def workspace(self, m: int, k: int) -> torch.Tensor:
        return torch.empty(self._lib.q4_workspace_bytes(m, k), dtype=torch.uint8)

    def linear_into(self, w: Q4Repacked, x: torch.Tensor, y: torch.Tensor,
                    work: torch.Tensor, isa: int = BEST_ISA, threads: int = 1) -> torch.Tensor:
        """y = x @ W.T with x quantized per block inside; x fp32 [m, k] contiguous, y [m, n]."""
        self._check(self._lib.q4_linear(isa, w.data.data_ptr(), w.out_features, w.in_features,
                                        x.data_ptr(), x.shape[0], y.data_ptr(),
                                        work.data_ptr(), threads), "q4_linear")
        return y

    def linear(self, w: Q4Repacked, x: torch.Tensor, isa: int = BEST_ISA,
               threads: int = 1) -> torch.Tensor:
        x = x.float().contiguous()
        y = torch.empty(x.shape[0], w.out_features)
        return self.linear_into(w, x, y, self.workspace(*x.shape), isa, threads)

    def split_workspace(self, m: int, n: int, k: int) -> torch.Tensor:
        return torch.empty(self._lib.q4_split_workspace_bytes(m, n, k), dtype=torch.uint8)

    def linear_split(self, w: Q4Repacked, x: torch.Tensor, isa: int = BEST_ISA,
                     threads: int = 1) -> torch.Tensor:
        """y = x @ W.T with x as a high and a low int8 part per block (~14 bits of it)."""
        x = x.float().contiguous()
        m = x.shape[0]
        y = torch.empty(m, w.out_features)
        work = self.split_workspace(m, w.out_features, w.in_features)
        self._check(self._lib.q4_linear_split(isa, w.data.data_ptr(), w.out_features,
                                              w.in_features, x.data_ptr(), m, y.data_ptr(),
                                              work.data_ptr(), threads), "q4_linear_split")
        return y

    @staticmethod
    def _check(rc: int, name: str) -> None:
        if rc:
            raise ValueError(f"{name} refused its arguments (k must be a multiple of 32, "
                             "shapes positive, and the instruction set one this CPU has)")
