"""Quantized weights applied through the kernel dispatch point: Triton on CUDA, and the torch
reference (dequantize, then multiply) wherever the fast CPU kernels do not apply."""

from __future__ import annotations

import torch

from pagoda.engine.quantization.tensors import Int4Weight, Int8Weight
from pagoda.kernels.kernel_ops import KernelOps


class KernelInt4Method:
    __slots__ = ("kernel", "weight")

    def __init__(self, weight: Int4Weight, ops: KernelOps) -> None:
        self.weight = weight
        self.kernel = ops.int4_linear

    def apply(self, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        w = self.weight
        return self.kernel(x, w.packed, w.scales, w.mins, w.group_size, bias)


class KernelInt8Method:
    __slots__ = ("kernel", "weight")

    def __init__(self, weight: Int8Weight, ops: KernelOps) -> None:
        self.weight = weight
        self.kernel = ops.int8_linear

    def apply(self, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        return self.kernel(x, self.weight.q, self.weight.scales, bias)
