"""pagoda/kernels/cpu/moe_tiles.c (a mixture-of-experts layer's routed experts for a step of many rows:
each expert's weights unpacked a tile at a time and multiplied with all its rows) through
ctypes.

Reads the layer moe_experts.py builds (`MoeExperts.layer`: the same C structure), for the
block types in TYPES (AVX2 only). Built and loaded by `pagoda.kernels.cpu.native`.
"""

from __future__ import annotations

import ctypes
from pathlib import Path

import torch

from pagoda.kernels.cpu import native
from pagoda.kernels.cpu.moe_experts import MoeLayer

NAME = "moe_tiles"
# The GGUF block types it reads (moe_experts.py's TYPE_CODES of them).
TYPES = ("Q4_0", "MXFP4", "Q4_K", "Q5_K", "Q6_K")
_ALIGN = 64


class MoeTiles:
    """The loaded library, with tensor-level calls. Tensors must be CPU ones."""

    def __init__(self, lib: ctypes.CDLL) -> None:
        self._lib = lib
        ptr, i32 = ctypes.c_void_p, ctypes.c_int
        signatures = {
            "moe_tiles_supported": ([ptr], i32),
            "moe_tiles_workspace_bytes": ([ptr, i32, i32], ctypes.c_size_t),
            "moe_tiles_forward": ([ptr, ptr, i32, ptr, ptr, ptr, i32, ptr, ptr, ptr, i32], i32),
        }
        for name, (args, result) in signatures.items():
            fn = getattr(lib, name)
            fn.argtypes, fn.restype = args, result

    @classmethod
    def load(cls, build_dir: Path | None, compiler: str | None = None) -> MoeTiles:
        """Raises native.NativeBuildError where the library can be neither found nor built."""
        return cls(native.load(NAME, build_dir, compiler))

    def supports(self, layer: MoeLayer, top_k: int) -> bool:
        """Whether this CPU (AVX2, FMA, F16C) and the layer's types and widths suit it."""
        layer.struct.top_k = top_k
        return bool(self._lib.moe_tiles_supported(ctypes.byref(layer.struct)))

    def workspace_bytes(self, layer: MoeLayer, m: int, top_k: int, threads: int) -> int:
        layer.struct.top_k = top_k
        return self._lib.moe_tiles_workspace_bytes(ctypes.byref(layer.struct), m, threads)

    def forward(self, layer: MoeLayer, x: torch.Tensor, topk_ids: torch.Tensor,
                topk_weights: torch.Tensor, threads: int = 1,
                work: torch.Tensor | None = None, out: torch.Tensor | None = None,
                ) -> torch.Tensor:
        """The routed experts' sum for x fp32 [m, hidden], topk_ids int64 and topk_weights
        fp32 [m, top_k] (as MoeExperts.forward takes them); work: at least
        workspace_bytes(layer, m, top_k, threads) + 64 bytes of uint8 (made here if None)."""
        m, top_k = x.shape[0], topk_ids.shape[-1]
        experts = layer.struct.num_experts
        if (x.dtype != torch.float32 or tuple(x.shape) != (m, layer.hidden)
                or not x.is_contiguous()):
            raise ValueError(f"x must be contiguous float32 [m, {layer.hidden}]")
        if topk_ids.dtype != torch.int64 or tuple(topk_ids.shape) != (m, top_k):
            raise ValueError(f"topk_ids must be int64 [{m}, {top_k}]")
        if (topk_weights.dtype != torch.float32 or tuple(topk_weights.shape) != (m, top_k)
                or not topk_weights.is_contiguous()):
            raise ValueError(f"topk_weights must be contiguous float32 [{m}, {top_k}]")
        if not m:
            return torch.empty(0, layer.hidden)
        flat = topk_ids.reshape(-1)
        if int(flat.min()) < 0 or int(flat.max()) >= experts:
            raise ValueError(f"an expert id is outside 0..{experts - 1}")
        if not self.supports(layer, top_k):
            raise ValueError("moe_tiles does not read this layer's blocks on this CPU")
        # The pairs (row * top_k + slot) grouped by expert, each expert's by row.
        order = torch.sort(flat, stable=True).indices.to(torch.int32)
        counts = torch.bincount(flat, minlength=experts)
        begin = torch.zeros(experts + 1, dtype=torch.int32)
        begin[1:] = torch.cumsum(counts, 0)
        active = torch.nonzero(counts).reshape(-1).to(torch.int32)
        needed = self.workspace_bytes(layer, m, top_k, threads) + _ALIGN
        if work is None or work.numel() < needed:
            work = torch.empty(needed, dtype=torch.uint8)
        if out is None:
            out = torch.empty(m, layer.hidden)
        aligned = -work.data_ptr() % _ALIGN
        rc = self._lib.moe_tiles_forward(
            ctypes.byref(layer.struct), x.data_ptr(), m, order.data_ptr(), begin.data_ptr(),
            active.data_ptr(), active.numel(), topk_weights.data_ptr(), out.data_ptr(),
            work.data_ptr() + aligned, threads)
        if rc:
            raise ValueError("moe_tiles_forward refused its arguments")
        return out
