"""pagoda/kernels/cpu/dequant.c through ctypes: int4, int8 and GGUF Q6_K, IQ4_XS, Q5_K and Q3_K weights widened to fp32 or
bf16 at memory speed.

Takes the weight's parts as tensors (pagoda/kernels/ does not import the engine's weight types): for
int4, packed uint8 [n, k / 2] in the engine's canonical nibble order, scales and mins
[n, k / group] in float32 or float16; for int8, q int8 [n, k], float32 scales [n, k / group]
and mins (or None).
"""

from __future__ import annotations

import ctypes

import torch

from pagoda.kernels.cpu.q4_gemv import Q4Repacked

NAME = "dequant"
# AVX512 (with BF16): int4 weights in either layout; int8 and Q6_K refuse it.
BEST_ISA, SCALAR, AVX2, AVX512 = -1, 0, 1, 2
_OUT_DTYPES = {torch.float32: 0, torch.bfloat16: 1}
_PARAM_DTYPES = (torch.float32, torch.float16)
# dequant.c's SB_* formats, and their super-blocks' bytes.
_SUB_BLOCK_TYPES = {"IQ4_XS": (0, 136), "Q5_K": (1, 176), "Q3_K": (2, 110)}


class Dequantizer:
    def __init__(self, lib: ctypes.CDLL, threads: int | None = None) -> None:
        """threads: OpenMP threads per call; None follows torch.get_num_threads() per call."""
        self._fn = lib.dq_int4
        ptr, i32 = ctypes.c_void_p, ctypes.c_int
        self._fn.argtypes = [ptr, ptr, ptr, i32, i32, i32, i32, i32, ptr, i32, i32]
        self._fn.restype = i32
        self._int8 = lib.dq_int8
        self._int8.argtypes = [ptr, ptr, ptr, i32, i32, i32, i32, ptr, i32, i32]
        self._int8.restype = i32
        self._repacked = lib.dq_q4_repacked
        self._repacked.argtypes = [ptr, i32, i32, i32, i32, ptr, i32, i32]
        self._repacked.restype = i32
        self._q6_k = lib.dq_q6_k
        self._q6_k.argtypes = [ptr, i32, i32, i32, ptr, i32, i32]
        self._q6_k.restype = i32
        self._sub_blocks = lib.dq_sub_blocks
        self._sub_blocks.argtypes = [ptr, i32, i32, i32, i32, ptr, i32, i32]
        self._sub_blocks.restype = i32
        self._take = lib.dq_take_rows
        self._take.argtypes = [ptr, ctypes.c_long, ctypes.c_long, ptr, i32, ptr]
        self._take.restype = i32
        self._has_vector = bool(lib.dq_has_vector_path())
        self._has_avx512 = bool(lib.dq_has_avx512_path())
        self._threads = threads

    @property
    def has_vector_path(self) -> bool:
        return self._has_vector

    @property
    def has_avx512_path(self) -> bool:
        """Whether int4 weights widen with AVX-512 and its BF16 conversion here."""
        return self._has_avx512

    def int4_into(self, packed: torch.Tensor, scales: torch.Tensor, mins: torch.Tensor,
                  out: torch.Tensor, isa: int = BEST_ISA) -> torch.Tensor:
        """out [n, k] (fp32 or bf16, contiguous) = q * scale + min, group = k / scales' width."""
        n, k = packed.shape[0], packed.shape[1] * 2
        _check_out(out, n, k)
        if scales.dtype not in _PARAM_DTYPES or mins.dtype not in _PARAM_DTYPES:
            raise ValueError(f"scales and mins must be float32 or float16, not {scales.dtype} "
                             f"and {mins.dtype}")
        packed, scales, mins = packed.contiguous(), scales.contiguous(), mins.contiguous()
        groups = scales.shape[1]
        if scales.shape != (n, groups) or mins.shape != (n, groups) or groups == 0 or k % groups:
            raise ValueError(f"scales and mins must be [{n}, groups] with groups dividing {k}")
        halves = (scales.dtype == torch.float16) | (mins.dtype == torch.float16) << 1
        threads = self._threads or torch.get_num_threads()
        rc = self._fn(packed.data_ptr(), scales.data_ptr(), mins.data_ptr(), halves, n, k,
                      k // groups, _OUT_DTYPES[out.dtype], out.data_ptr(), isa, threads)
        if rc:
            raise ValueError(f"dq_int4 refused instruction set {isa} on this CPU")
        return out

    def int8_into(self, q: torch.Tensor, scales: torch.Tensor, mins: torch.Tensor | None,
                  out: torch.Tensor, isa: int = BEST_ISA) -> torch.Tensor:
        """out [n, k] = q * scale (+ min), group = k / scales' width (1 column: per channel)."""
        n, k = q.shape
        _check_out(out, n, k)
        scales = scales.float().reshape(n, -1).contiguous()
        groups = scales.shape[1]
        if k % groups:
            raise ValueError(f"{groups} groups per row do not divide {k} inputs")
        mins = None if mins is None else mins.float().reshape(n, groups).contiguous()
        threads = self._threads or torch.get_num_threads()
        rc = self._int8(q.contiguous().data_ptr(), scales.data_ptr(),
                        None if mins is None else mins.data_ptr(), n, k, k // groups,
                        _OUT_DTYPES[out.dtype], out.data_ptr(), isa, threads)
        if rc:
            raise ValueError(f"dq_int8 refused instruction set {isa} on this CPU")
        return out

    def q4_repacked_into(self, weight: Q4Repacked, out: torch.Tensor,
                         isa: int = BEST_ISA) -> torch.Tensor:
        """out [n, k] = the weight q4_gemv multiplies by, read from its own layout (any
        record format)."""
        n, k = weight.out_features, weight.in_features
        _check_out(out, n, k)
        threads = self._threads or torch.get_num_threads()
        rc = self._repacked(weight.data.data_ptr(), weight.record_format, n, k,
                            _OUT_DTYPES[out.dtype], out.data_ptr(), isa, threads)
        if rc:
            raise ValueError(f"dq_q4_repacked refused instruction set {isa} or k={k} (a "
                             "multiple of 32)")
        return out


    def q6_k_into(self, blocks: torch.Tensor, k: int, out: torch.Tensor,
                  isa: int = BEST_ISA) -> torch.Tensor:
        """out [n, k] = d * sc * (q - 32) from GGUF Q6_K rows (uint8 [n, k / 256 * 210]),
        as gguf's reference computes it."""
        n = blocks.shape[0]
        _check_out(out, n, k)
        if blocks.dtype != torch.uint8 or k % 256 or blocks.shape != (n, k // 256 * 210):
            raise ValueError(f"Q6_K rows of {k} weights are uint8 [{n}, {k // 256 * 210}], not "
                             f"{blocks.dtype} {tuple(blocks.shape)}")
        threads = self._threads or torch.get_num_threads()
        rc = self._q6_k(blocks.contiguous().data_ptr(), n, k, _OUT_DTYPES[out.dtype],
                        out.data_ptr(), isa, threads)
        if rc:
            raise ValueError(f"dq_q6_k refused instruction set {isa} on this CPU")
        return out

    def sub_blocks_into(self, blocks: torch.Tensor, type_name: str, k: int, out: torch.Tensor,
                        isa: int = BEST_ISA) -> torch.Tensor:
        """out [n, k] = (d * sc) * q - dmin * m from GGUF IQ4_XS, Q5_K or Q3_K rows (uint8
        [n, k / 256 * their bytes]), as gguf's reference computes it."""
        n = blocks.shape[0]
        _check_out(out, n, k)
        if type_name not in _SUB_BLOCK_TYPES:
            raise ValueError(f"no sub-block dequantization for {type_name!r}: one of "
                             f"{', '.join(_SUB_BLOCK_TYPES)}")
        fmt, super_bytes = _SUB_BLOCK_TYPES[type_name]
        if blocks.dtype != torch.uint8 or k % 256 or blocks.shape != (n, k // 256 * super_bytes):
            raise ValueError(f"{type_name} rows of {k} weights are uint8 "
                             f"[{n}, {k // 256 * super_bytes}], not {blocks.dtype} "
                             f"{tuple(blocks.shape)}")
        threads = self._threads or torch.get_num_threads()
        rc = self._sub_blocks(blocks.contiguous().data_ptr(), fmt, n, k,
                              _OUT_DTYPES[out.dtype], out.data_ptr(), isa, threads)
        if rc:
            raise ValueError(f"dq_sub_blocks refused instruction set {isa} on this CPU")
        return out

    def take_rows(self, t: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
        """t.index_select(0, index), copied on the calling thread where t is contiguous and
        index a 1-D int64 tensor (a few rows: a decode step's embeddings and exact-logit
        candidates)."""
        row_bytes = t[0].numel() * t.element_size() if t.shape[0] else 0
        if (not t.is_contiguous() or index.dtype != torch.int64 or index.dim() != 1
                or not index.shape[0] or not row_bytes):
            # A view (not to be copied whole), another index, or empty: torch's, its errors.
            return t.index_select(0, index)
        index = index.contiguous()
        out = t.new_empty((index.shape[0], *t.shape[1:]))
        if self._take(t.data_ptr(), row_bytes, t.shape[0], index.data_ptr(), index.shape[0],
                      out.data_ptr()):
            raise IndexError(f"a row index outside [0, {t.shape[0]}): "
                             f"{index.min().item()}..{index.max().item()}")
        return out


def _check_out(out: torch.Tensor, n: int, k: int) -> None:
    if out.shape != (n, k) or not out.is_contiguous() or out.dtype not in _OUT_DTYPES:
        raise ValueError(f"out must be a contiguous float32 or bfloat16 [{n}, {k}] tensor, "
                         f"not {out.dtype} {tuple(out.shape)}")
