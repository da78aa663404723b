"""Per-channel int8 weights on the CPU through PyTorch's `_weight_int8pack_mm`, vectorized for
bfloat16 activations only, like the int4 kernel (grouped int8 goes through `split_int8`)."""

from __future__ import annotations

import torch

from pagoda.engine.quantization import cpu_paths
from pagoda.engine.quantization.cpu_paths import CpuPathPolicy
from pagoda.engine.quantization.tensors import Int8Weight


class CpuInt8Method:
    __slots__ = ("policy", "scales_bf16", "weight")

    def __init__(self, weight: Int8Weight, policy: CpuPathPolicy | None = None) -> None:
        self.weight = Int8Weight(weight.q.contiguous(), weight.scales.float())
        self.scales_bf16 = weight.scales.to(torch.bfloat16)
        self.policy = policy or CpuPathPolicy()

    def apply(self, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        return cpu_paths.apply(self, x, bias)

    def kernel(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.ops.aten._weight_int8pack_mm(x.to(torch.bfloat16), self.weight.q,
                                               self.scales_bf16)
        return y.to(x.dtype)

    def dequantized(self, dtype: torch.dtype) -> torch.Tensor:
        return self.policy.workspace.dequantize(self.weight, dtype)
