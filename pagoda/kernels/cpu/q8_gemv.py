"""pagoda/kernels/cpu/q8_gemv.c (grouped int8 weights read in place, times int8 or int16 activations
quantized per block of 32) through ctypes.

Takes the weight's parts as tensors (pagoda/kernels/ does not import the engine's weight types): q int8
[n, k], scales [n, k / 32] and optional mins [n, k / 32], each float32 or float16. Built and
loaded by `pagoda.kernels.cpu.native` (which binds it to torch's OpenMP runtime).
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass
from pathlib import Path

import torch

from pagoda.kernels.cpu import block_quant, native

NAME = "q8_gemv"
BEST_ISA = -1
GROUP_SIZE = 32
_PARAM_DTYPES = (torch.float32, torch.float16)
_SCALES_HALF, _MINS_HALF = 1, 2
Q6_K_SUPER_BLOCK, Q6_K_BLOCK_BYTES = 256, 210
# GGUF block types read in place: (the `halves` flag saying so, bytes per 256 values).
# The block types whose int8 activations `linear` quantizes a scale per 256 values (q8_gemv.c).
SUPER_SCALED_TYPES = ("IQ4_XS", "Q5_K", "Q6_K")
BLOCK_TYPES = {"Q6_K": (4, Q6_K_BLOCK_BYTES), "IQ4_XS": (8, 136), "Q5_K": (16, 176),
               "Q3_K": (32, 110)}


@dataclass(slots=True, frozen=True)
class Q8Operand:
    """A grouped int8 weight, or GGUF Q6_K blocks, as the kernel reads it: the caller's own
    tensors, checked once (`Q8Gemv.operand`, `Q8Gemv.q6_k_operand`), so a call passes their
    addresses with no copy."""

    q: torch.Tensor  # int8 [n, k], or GGUF blocks uint8 [n, k / 256 * bytes a super-block]
    scales: torch.Tensor | None  # None: GGUF blocks hold their own
    mins: torch.Tensor | None
    halves: int
    in_features: int

    @property
    def out_features(self) -> int:
        return self.q.shape[0]

    @property
    def pointers(self) -> tuple[int, int | None, int | None, int]:
        """(q, scales or None, mins or None, halves): the weight's first four arguments to
        the C calls."""
        scales = None if self.scales is None else self.scales.data_ptr()
        mins = None if self.mins is None else self.mins.data_ptr()
        return self.q.data_ptr(), scales, mins, self.halves


class Q8Gemv:
    """The loaded library, with tensor-level calls. Tensors must be CPU ones."""

    def __init__(self, lib: ctypes.CDLL) -> None:
        self._lib = lib
        self._declare()

    @classmethod
    def load(cls, build_dir: Path | None, compiler: str | None = None) -> Q8Gemv:
        """Raises native.NativeBuildError where the library can be neither found nor built."""
        return cls(native.load(NAME, build_dir, compiler))

    def _declare(self) -> None:
        ptr, i32, size = ctypes.c_void_p, ctypes.c_int, ctypes.c_size_t
        weight = [ptr, ptr, ptr, i32, i32, i32]
        signatures = {
            "q8_best_isa": ([], i32),
            "q8_isa_supported": ([i32], i32),
            "q8_workspace_bytes": ([i32, i32], size),
            "q8_workspace16_bytes": ([i32, i32], size),
            "q8_quantize_rows": ([i32, ptr, i32, i32, ptr, ptr, ptr], i32),
            "q8_quantize_rows16": ([i32, ptr, i32, i32, ptr, ptr, ptr], i32),
            "q8_quantize_rows_super": ([i32, ptr, i32, i32, ptr, ptr, ptr], i32),
            "q8_gemm": ([i32, *weight, ptr, ptr, ptr, i32, ptr, i32], i32),
            "q8_gemm16": ([i32, *weight, ptr, ptr, ptr, i32, ptr, i32], i32),
            "q8_gemm_super": ([i32, *weight, ptr, ptr, ptr, i32, ptr, i32], i32),
            "q8_linear": ([i32, *weight, ptr, i32, ptr, ptr, i32], i32),
            "q8_linear16": ([i32, *weight, ptr, i32, ptr, ptr, i32], i32),
        }
        for name, (args, result) in signatures.items():
            fn = getattr(self._lib, name)
            fn.argtypes, fn.restype = args, result

    @property
    def raw(self) -> ctypes.CDLL:
        """The library itself, its functions declared: for callers that keep their pointers
        and call it directly (a ctypes call with no tensor-level checks)."""
        return self._lib

    def best_isa(self) -> int:
        return self._lib.q8_best_isa()

    def isa_supported(self, isa: int) -> bool:
        return bool(self._lib.q8_isa_supported(isa))

    def workspace_bytes(self, m: int, k: int) -> int:
        return self._lib.q8_workspace_bytes(m, k)

    def workspace16_bytes(self, m: int, k: int) -> int:
        return self._lib.q8_workspace16_bytes(m, k)

    @staticmethod
    def operand(q: torch.Tensor, scales: torch.Tensor,
                mins: torch.Tensor | None = None) -> Q8Operand:
        """The weight w[n, j] = q[n, j] * scales[n, j // 32] (+ mins[n, j // 32]), as it is:
        raises ValueError for shapes, dtypes or layouts the kernel cannot read in place."""
        if q.dtype != torch.int8 or q.dim() != 2 or not q.is_contiguous():
            raise ValueError(f"q must be a contiguous int8 [n, k] tensor, not {q.dtype} "
                             f"{tuple(q.shape)}")
        n, k = q.shape
        if k % GROUP_SIZE:
            raise ValueError(f"the input width ({k}) must be a multiple of {GROUP_SIZE}")
        groups = (n, k // GROUP_SIZE)
        for name, t in (("scales", scales), ("mins", mins)):
            if t is None:
                continue
            if t.dtype not in _PARAM_DTYPES or tuple(t.shape) != groups or not t.is_contiguous():
                raise ValueError(f"{name} must be contiguous float32 or float16 {list(groups)} "
                                 f"(a group of {GROUP_SIZE}), not {t.dtype} {tuple(t.shape)}")
        halves = (_SCALES_HALF if scales.dtype == torch.float16 else 0) | (
            _MINS_HALF if mins is not None and mins.dtype == torch.float16 else 0)
        return Q8Operand(q, scales, mins, halves, k)

    @staticmethod
    def q6_k_operand(blocks: torch.Tensor) -> Q8Operand:
        """GGUF Q6_K rows as the file stores them (uint8 [n, super-blocks x 210]), read in
        place: w = d * sc * (q - 32) per sub-block of 16 (pagoda/kernels/cpu/q6_k_blocks.h)."""
        return Q8Gemv.blocks_operand(blocks, "Q6_K")

    @staticmethod
    def blocks_operand(blocks: torch.Tensor, type_name: str) -> Q8Operand:
        """GGUF rows of a type in BLOCK_TYPES as the file stores them (uint8 [n, super-blocks x
        its bytes]), read in place (pagoda/kernels/cpu/q6_k_blocks.h, iq4_xs_blocks.h, q5_k_blocks.h,
        q3_k_blocks.h)."""
        if type_name not in BLOCK_TYPES:
            raise ValueError(f"q8_gemv reads {', '.join(BLOCK_TYPES)} blocks, not {type_name}")
        flag, size = BLOCK_TYPES[type_name]
        if blocks.dtype != torch.uint8 or blocks.dim() != 2 or not blocks.is_contiguous():
            raise ValueError(f"{type_name} blocks must be a contiguous uint8 [n, bytes] tensor, "
                             f"not {blocks.dtype} {tuple(blocks.shape)}")
        if blocks.shape[1] == 0 or blocks.shape[1] % size:
            raise ValueError(f"a {type_name} row is whole {size}-byte super-blocks, not "
                             f"{blocks.shape[1]} bytes")
        k = blocks.shape[1] // size * Q6_K_SUPER_BLOCK
        return Q8Operand(blocks, None, None, flag, k)

    def quantize_rows(self, x: torch.Tensor, isa: int = BEST_ISA,
                      ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """fp32 [m, k] -> int8 [m, k] (per block of 32, s_x = max|x| / 127), scales and sums
        (s_x times the sum of the rounded block) fp32 [m, k / 32]."""
        return self._quantize_rows("q8_quantize_rows", torch.int8, x, isa)

    def quantize_rows16(self, x: torch.Tensor, isa: int = BEST_ISA,
                        ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """As quantize_rows, to int16 (s_x = max|x| / 32767)."""
        return self._quantize_rows("q8_quantize_rows16", torch.int16, x, isa)

    def quantize_rows_super(self, x: torch.Tensor, isa: int = BEST_ISA,
                            ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """As quantize_rows, one scale per 256 values (k a multiple of 256), repeated in each
        of their 8 blocks' entries: how `linear` quantizes activations for IQ4_XS and Q5_K
        blocks (SUPER_SCALED_TYPES)."""
        return self._quantize_rows("q8_quantize_rows_super", torch.int8, x, isa)

    def gemm(self, w: Q8Operand, xq: torch.Tensor, scale: torch.Tensor, total: torch.Tensor,
             isa: int = BEST_ISA, threads: int = 1, super_scales: bool = False) -> torch.Tensor:
        """The product of quantize_rows' (int8) or quantize_rows16's (int16) output and w;
        super_scales: quantize_rows_super's output, which IQ4_XS and Q5_K blocks then read a
        super-block at a time."""
        name = ("q8_gemm_super" if super_scales else "q8_gemm" if xq.dtype == torch.int8
                else "q8_gemm16")
        m = xq.shape[0]
        y = torch.empty(m, w.out_features)
        self._check(getattr(self._lib, name)(isa, *w.pointers, w.out_features, w.in_features,
                                             xq.data_ptr(), scale.data_ptr(), total.data_ptr(),
                                             m, y.data_ptr(), threads), name)
        return y

    def linear(self, w: Q8Operand, x: torch.Tensor, isa: int = BEST_ISA, threads: int = 1,
               wide: bool = False) -> torch.Tensor:
        """y = x @ W.T with x quantized per block inside: to int16 if wide, else int8 (per
        256 values for the SUPER_SCALED_TYPES' blocks, as quantize_rows_super)."""
        x = x.float().contiguous()
        m = x.shape[0]
        y = torch.empty(m, w.out_features)
        size = self.workspace16_bytes if wide else self.workspace_bytes
        work = torch.empty(size(m, w.in_features), dtype=torch.uint8)
        name = "q8_linear16" if wide else "q8_linear"
        self._check(getattr(self._lib, name)(isa, *w.pointers, w.out_features, w.in_features,
                                             x.data_ptr(), m, y.data_ptr(), work.data_ptr(),
                                             threads), name)
        return y

    def _quantize_rows(self, name: str, dtype: torch.dtype, x: torch.Tensor, isa: int,
                       ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        rc, xq, scale, total = block_quant.quantize_rows(getattr(self._lib, name), dtype, x, isa)
        self._check(rc, name)
        return xq, scale, total

    @staticmethod
    def _check(rc: int, name: str) -> None:
        if rc:
            raise ValueError(f"{name} refused its arguments (k must be a multiple of 32, "
                             "shapes positive, and the instruction set one this CPU has)")
