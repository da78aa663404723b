"""int8 weights on the CPU through PyTorch's `_weight_int8pack_mm`, vectorized for bfloat16
activations only, like the int4 kernel. It takes one scale per output channel: grouped int8
(GGUF's Q8_0) is requantized per channel for it."""

from __future__ import annotations

import torch

from engine.quantization import cpu_paths
from engine.quantization.cpu_paths import CpuPathPolicy
from engine.quantization.tensors import Int8Weight, dequantize, per_channel_int8


class CpuInt8Method:
    __slots__ = ("numel", "policy", "scales_bf16", "weight")

    def __init__(self, weight: Int8Weight) -> None:
        per_channel = per_channel_int8(weight)
        self.weight = Int8Weight(per_channel.q.contiguous(), per_channel.scales.float())
        self.scales_bf16 = per_channel.scales.to(torch.bfloat16)
        self.policy = CpuPathPolicy()
        self.numel = weight.q.numel()

    def apply(self, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        return cpu_paths.apply(self, x, bias)

    def kernel(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.ops.aten._weight_int8pack_mm(x.to(torch.bfloat16), self.weight.q,
                                               self.scales_bf16)
        return y.to(x.dtype)

    def dequantized(self, dtype: torch.dtype) -> torch.Tensor:
        return dequantize(self.weight, dtype)

    def drop_dequantize_source(self) -> None:
        """The kernel reads the same int8 values: nothing extra is kept."""
