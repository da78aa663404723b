"""Quantized layers widened for one GEMM on a CPU (`cpu_paths`), into one buffer that every layer
of a model shares.

A prefill chunk of hundreds of rows runs faster as one GEMM on the widened layer than through a
weight-only kernel, if widening is cheap: our C kernel (pagoda/kernels/cpu/dequant.c) does it at memory
speed, 15-20x faster than torch's composition of the same math, and into a buffer kept from
layer to layer, because a fresh 92 MB tensor per layer (a 1B model's gate/up) costs more in page
faults than the widening itself. The engine steps on one thread and each GEMM finishes before
the next layer widens, so one buffer serves the whole model. It grows to the largest layer
widened and stays.
"""

from __future__ import annotations

import torch

from pagoda.engine.quantization.native_kernels import load_native
from pagoda.engine.quantization.tensors import (
    BlockWeight,
    Int4Weight,
    Int8Weight,
    Q6KWeight,
    Weight,
    dequantize,
    dequantize_rows,
    select_rows,
)
from pagoda.kernels.cpu.dequant import Dequantizer
from pagoda.kernels.cpu.q4_gemv import Q4Repacked

_DTYPES = (torch.float32, torch.bfloat16)


class DequantWorkspace:
    __slots__ = ("_buffers", "_dq")

    def __init__(self, dq: Dequantizer | None) -> None:
        self._dq = dq
        self._buffers: dict[torch.dtype, torch.Tensor] = {}

    @classmethod
    def for_this_machine(cls) -> DequantWorkspace:
        """Our kernel where it builds (pagoda.engine.quantization.native_kernels), else torch's dequantize."""
        lib = load_native("dequant")
        return cls(None if lib is None else Dequantizer(lib))

    @property
    def native(self) -> bool:
        return self._dq is not None

    @property
    def nbytes(self) -> int:
        return sum(b.numel() * b.element_size() for b in self._buffers.values())

    def dequantize(self, weight: Weight, dtype: torch.dtype) -> torch.Tensor:
        """The weight at dtype. Where our kernel applies, a view of the shared buffer, valid
        until the next call; else a new tensor from torch's dequantize."""
        if self._dq is None or dtype not in _DTYPES or isinstance(weight, torch.Tensor):
            return dequantize(weight, dtype)
        return self._into(weight, self._view(weight.shape, dtype))

    def gather(self, weight: Weight, rows: torch.Tensor, dtype: torch.dtype,
               reuse_buffer: bool = False) -> torch.Tensor:
        """Only the rows at `rows` widened, [*rows.shape, k]: an embedding lookup, the
        vocabulary's candidates for exact logits (torch's composition of the same math cost
        ~0.2-0.4 ms of a 1B model's decode step; ours ~20 µs). Into a new tensor, or with
        reuse_buffer into the shared buffer, valid until the next call (a fresh 256 KB tensor
        per step costs its page faults)."""
        if self._dq is None or dtype not in _DTYPES or isinstance(weight, torch.Tensor):
            return dequantize_rows(weight, rows, dtype)
        picked = select_rows(weight, rows.reshape(-1), self._dq.take_rows)
        out = (self._view(picked.shape, dtype) if reuse_buffer
               else torch.empty(picked.shape, dtype=dtype))
        return self._into(picked, out).view(*rows.shape, -1)

    def _into(self, weight: Weight, out: torch.Tensor) -> torch.Tensor:
        if isinstance(weight, Int4Weight):
            return self._dq.int4_into(weight.packed, weight.scales, weight.mins, out)
        if isinstance(weight, Q6KWeight):
            return self._dq.q6_k_into(weight.blocks, weight.shape[1], out)
        if isinstance(weight, BlockWeight):  # IQ4_XS, Q5_K, Q3_K: from their blocks
            return self._dq.sub_blocks_into(weight.blocks, weight.TYPE_NAME, weight.shape[1],
                                            out)
        assert isinstance(weight, Int8Weight)
        return self._dq.int8_into(weight.q, weight.scales, weight.mins, out)

    def dequantize_repacked(self, weight: Q4Repacked, dtype: torch.dtype) -> torch.Tensor:
        """q4_gemv's layout widened in place (so a q4_gemv layer keeps no second copy to
        dequantize from); only where our kernel runs (`native`)."""
        if self._dq is None:
            raise RuntimeError("q4_gemv's layout is widened by our dequant kernel only")
        out = self._view((weight.out_features, weight.in_features), dtype)
        return self._dq.q4_repacked_into(weight, out)

    def release(self) -> None:
        """Frees the buffer (after the load-time timing, where no step will widen a layer)."""
        self._buffers.clear()

    def _view(self, shape: tuple[int, int], dtype: torch.dtype) -> torch.Tensor:
        numel = shape[0] * shape[1]
        buffer = self._buffers.get(dtype)
        if buffer is None or buffer.numel() < numel:
            self._buffers.pop(dtype, None)  # freed before the larger one is made
            buffer = self._buffers[dtype] = torch.empty(numel, dtype=dtype)
        return buffer[:numel].view(shape)
