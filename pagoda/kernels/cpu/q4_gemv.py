"""Build and call pagoda/kernels/cpu/q4_gemv.c (int8 activations x int4 weights) through ctypes.

Built and loaded by `pagoda.kernels.cpu.native` (which binds it to torch's OpenMP runtime).
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass
from pathlib import Path

import torch

from pagoda.kernels.cpu import block_quant, native
from pagoda.kernels.cpu.huge_pages import huge_page_buffer

ISA_NAMES = {0: "scalar", 1: "avx2", 2: "avx512-vnni"}
BEST_ISA = -1
NAME = "q4_gemv"
# Record formats (pagoda/kernels/cpu/q4_records.h): fp32 scales and mins (96 bytes per 128 weights),
# fp16 ones (80), GGUF Q4_K's six-bit sub-block scales and mins with fp16 d and dmin per
# super-block of 256 (74 on average).
FP32_RECORDS, FP16_RECORDS, KQ_RECORDS = 0, 1, 2
KQ_SUPER_BLOCK = 256


@dataclass(slots=True, frozen=True)
class Q4Repacked:
    """A weight in the kernel's tiled layout (uint8), for out_features x in_features.

    record_format: how its records hold scales and mins; every call that reads the weight
    passes it (pagoda/kernels/cpu/q4_gemv.c)."""

    data: torch.Tensor
    out_features: int
    in_features: int
    record_format: int

    @property
    def compact(self) -> bool:
        """fp16 scales and mins."""
        return self.record_format == FP16_RECORDS


class Q4Gemv:
    """The loaded library, with tensor-level calls. Tensors must be contiguous CPU ones."""

    def __init__(self, lib: ctypes.CDLL) -> None:
        self._lib = lib
        self._declare()

    @classmethod
    def load(cls, build_dir: Path | None, compiler: str | None = None) -> Q4Gemv:
        """Raises native.NativeBuildError where the library can be neither found nor built."""
        return cls(native.load(NAME, build_dir, compiler))

    def _declare(self) -> None:
        ptr, i32, size = ctypes.c_void_p, ctypes.c_int, ctypes.c_size_t
        signatures = {
            "q4_best_isa": ([], i32),
            "q4_isa_supported": ([i32], i32),
            "q4_repacked_bytes": ([i32, i32, i32], size),
            "q4_workspace_bytes": ([i32, i32], size),
            "q4_repack": ([ptr, ptr, ptr, i32, i32, i32, ptr], i32),
            "q4_repack_kq": ([ptr, ptr, ptr, ptr, ptr, i32, i32, ptr], i32),
            "q4_quantize_rows": ([i32, ptr, i32, i32, ptr, ptr, ptr], i32),
            "q4_gemm": ([i32, ptr, i32, i32, i32, ptr, ptr, ptr, i32, ptr, i32], i32),
            "q4_linear": ([i32, ptr, i32, i32, i32, ptr, i32, ptr, ptr, i32], i32),
            "q4_split_workspace_bytes": ([i32, i32, i32], size),
            "q4_linear_split": ([i32, ptr, i32, i32, i32, ptr, i32, ptr, ptr, i32], i32),
            "q4_workspace16_bytes": ([i32, i32], size),
            "q4_quantize_rows16": ([i32, ptr, i32, i32, ptr, ptr, ptr], i32),
            "q4_gemm16": ([i32, ptr, i32, i32, i32, ptr, ptr, ptr, i32, ptr, i32], i32),
            "q4_linear16": ([i32, ptr, i32, i32, i32, ptr, i32, ptr, ptr, i32], i32),
        }
        for name, (args, result) in signatures.items():
            fn = getattr(self._lib, name)
            fn.argtypes, fn.restype = args, result

    @property
    def raw(self) -> ctypes.CDLL:
        """The library itself, its functions declared: for callers that keep their pointers
        and call it directly (a ctypes call with no tensor-level checks, ~3 µs)."""
        return self._lib

    def workspace_bytes(self, m: int, k: int) -> int:
        return self._lib.q4_workspace_bytes(m, k)

    def split_workspace_bytes(self, m: int, n: int, k: int) -> int:
        return self._lib.q4_split_workspace_bytes(m, n, k)

    def workspace16_bytes(self, m: int, k: int) -> int:
        return self._lib.q4_workspace16_bytes(m, k)

    def best_isa(self) -> int:
        return self._lib.q4_best_isa()

    def isa_supported(self, isa: int) -> bool:
        return bool(self._lib.q4_isa_supported(isa))

    def repacked_bytes(self, n: int, k: int, record_format: int) -> int:
        """0 where the format does not fit k (KQ_RECORDS: whole super-blocks of 256)."""
        return self._lib.q4_repacked_bytes(record_format, n, k)

    def repack(self, packed: torch.Tensor, scales: torch.Tensor, mins: torch.Tensor,
               ) -> Q4Repacked:
        """packed uint8 [n, k / 2] (two 4-bit values per byte, the engine's Int4Weight
        layout), scales and mins [n, k / 32]: weight = q * scale + min. Compact records where
        scales and mins are both float16 (the caller's word that fp16 holds them: the engine's
        `with_compact_scales`), fp32 ones otherwise."""
        n, k = packed.shape[0], packed.shape[1] * 2
        compact = scales.dtype == mins.dtype == torch.float16
        record_format = FP16_RECORDS if compact else FP32_RECORDS
        packed = packed.contiguous()
        if not compact:
            scales, mins = scales.float(), mins.float()
        scales, mins = scales.contiguous(), mins.contiguous()
        out = huge_page_buffer(self.repacked_bytes(n, k, record_format))
        self._check(self._lib.q4_repack(packed.data_ptr(), scales.data_ptr(), mins.data_ptr(),
                                        record_format, n, k, out.data_ptr()), "q4_repack")
        return Q4Repacked(out, n, k, record_format)

    def repack_kq(self, packed: torch.Tensor, d: torch.Tensor, dmin: torch.Tensor,
                  sc: torch.Tensor, m: torch.Tensor) -> Q4Repacked:
        """GGUF Q4_K's parts: packed as `repack`'s; d, dmin float16 [n, k / 256]; sc, m uint8
        [n, k / 32], six-bit: weight = q * (d * sc) - dmin * m, the same products as `repack`
        of those scales and mins in fp32."""
        n, k = packed.shape[0], packed.shape[1] * 2
        size = self.repacked_bytes(n, k, KQ_RECORDS)
        if not size or d.dtype != torch.float16 or sc.dtype != torch.uint8:
            raise ValueError(f"Q4_K records need k a multiple of {KQ_SUPER_BLOCK} (got {k}), "
                             f"fp16 d and uint8 sub-scales (got {d.dtype}, {sc.dtype})")
        parts = [t.contiguous() for t in (packed, d, dmin, sc, m)]
        out = huge_page_buffer(size)
        self._check(self._lib.q4_repack_kq(*(t.data_ptr() for t in parts), n, k,
                                           out.data_ptr()), "q4_repack_kq")
        return Q4Repacked(out, n, k, KQ_RECORDS)

    def quantize_rows(self, x: torch.Tensor, isa: int = BEST_ISA,
                      ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """fp32 [m, k] -> int8 [m, k], scales and sums fp32 [m, k / 32]."""
        return self._quantize_rows("q4_quantize_rows", torch.int8, x, isa)

    def gemm(self, w: Q4Repacked, xq: torch.Tensor, scale: torch.Tensor, total: torch.Tensor,
             isa: int = BEST_ISA, threads: int = 1) -> torch.Tensor:
        return self._gemm("q4_gemm", w, xq, scale, total, isa, threads)

    def workspace(self, m: int, k: int) -> torch.Tensor:
        return torch.empty(self.workspace_bytes(m, k), dtype=torch.uint8)

    def linear_into(self, w: Q4Repacked, x: torch.Tensor, y: torch.Tensor,
                    work: torch.Tensor, isa: int = BEST_ISA, threads: int = 1) -> torch.Tensor:
        """y = x @ W.T with x quantized per block inside; x fp32 [m, k] contiguous, y [m, n]."""
        self._check(self._lib.q4_linear(isa, w.data.data_ptr(), w.record_format, w.out_features,
                                        w.in_features, x.data_ptr(), x.shape[0], y.data_ptr(),
                                        work.data_ptr(), threads), "q4_linear")
        return y

    def linear(self, w: Q4Repacked, x: torch.Tensor, isa: int = BEST_ISA,
               threads: int = 1) -> torch.Tensor:
        x = x.float().contiguous()
        y = torch.empty(x.shape[0], w.out_features)
        return self.linear_into(w, x, y, self.workspace(*x.shape), isa, threads)

    def split_workspace(self, m: int, n: int, k: int) -> torch.Tensor:
        return torch.empty(self.split_workspace_bytes(m, n, k), dtype=torch.uint8)

    def linear_split(self, w: Q4Repacked, x: torch.Tensor, isa: int = BEST_ISA,
                     threads: int = 1) -> torch.Tensor:
        """y = x @ W.T with x as a high and a low int8 part per block (~14 bits of it)."""
        x = x.float().contiguous()
        m = x.shape[0]
        y = torch.empty(m, w.out_features)
        work = self.split_workspace(m, w.out_features, w.in_features)
        self._check(self._lib.q4_linear_split(isa, w.data.data_ptr(), w.record_format,
                                              w.out_features, w.in_features, x.data_ptr(), m,
                                              y.data_ptr(), work.data_ptr(), threads),
                    "q4_linear_split")
        return y

    def quantize_rows16(self, x: torch.Tensor, isa: int = BEST_ISA,
                        ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """fp32 [m, k] -> int16 [m, k] (per block of 32, s_x = max|x| / 32767), scales and
        sums fp32 [m, k / 32]."""
        return self._quantize_rows("q4_quantize_rows16", torch.int16, x, isa)

    def gemm16(self, w: Q4Repacked, xq: torch.Tensor, scale: torch.Tensor, total: torch.Tensor,
               isa: int = BEST_ISA, threads: int = 1) -> torch.Tensor:
        return self._gemm("q4_gemm16", w, xq, scale, total, isa, threads)

    def linear16(self, w: Q4Repacked, x: torch.Tensor, isa: int = BEST_ISA,
                 threads: int = 1) -> torch.Tensor:
        """y = x @ W.T with x quantized to int16 per block inside (~16 bits of it)."""
        x = x.float().contiguous()
        m = x.shape[0]
        y = torch.empty(m, w.out_features)
        work = torch.empty(self.workspace16_bytes(m, w.in_features), dtype=torch.uint8)
        self._check(self._lib.q4_linear16(isa, w.data.data_ptr(), w.record_format,
                                          w.out_features, w.in_features, x.data_ptr(), m,
                                          y.data_ptr(), work.data_ptr(), threads), "q4_linear16")
        return y

    def _quantize_rows(self, name: str, dtype: torch.dtype, x: torch.Tensor, isa: int,
                       ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        rc, xq, scale, total = block_quant.quantize_rows(getattr(self._lib, name), dtype, x, isa)
        self._check(rc, name)
        return xq, scale, total

    def _gemm(self, name: str, w: Q4Repacked, xq: torch.Tensor, scale: torch.Tensor,
              total: torch.Tensor, isa: int, threads: int) -> torch.Tensor:
        m = xq.shape[0]
        y = torch.empty(m, w.out_features)
        self._check(getattr(self._lib, name)(isa, w.data.data_ptr(), w.record_format,
                                             w.out_features, w.in_features, xq.data_ptr(),
                                             scale.data_ptr(), total.data_ptr(), m, y.data_ptr(),
                                             threads), name)
        return y

    @staticmethod
    def _check(rc: int, name: str) -> None:
        if rc:
            raise ValueError(f"{name} refused its arguments (k must be a multiple of 32, "
                             "shapes positive, and the instruction set one this CPU has)")
