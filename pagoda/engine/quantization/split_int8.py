"""Grouped int8 weights (GGUF's Q8_0, "int8" quantized on load) through an int4 kernel.

PyTorch's int8 CPU kernel takes one scale per output channel, which loses most of what groups of
32 keep (per-channel int8 agreed with the dequantized default model on 96.4% of next tokens).
Split into high and low nibbles (`split_int8_into_int4`), the weight is exactly two int4 weights
stacked along the output dimension: one int4 matmul over both, then the halves' outputs added.
It reads the same bytes as int8 would, and the int4 kernels are the faster ones.
"""

from __future__ import annotations

import torch

from pagoda.engine.quantization import cpu_paths
from pagoda.engine.quantization.base import LinearMethod
from pagoda.engine.quantization.cpu_int4 import CpuInt4Method
from pagoda.engine.quantization.cpu_paths import CpuPathPolicy
from pagoda.engine.quantization.tensors import Int8Weight


class SplitInt8Method:
    __slots__ = ("inner", "out_features")

    def __init__(self, inner: LinearMethod, out_features: int) -> None:
        self.inner = inner
        self.out_features = out_features

    def apply(self, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        halves = self.inner.apply(x, None)
        y = halves[..., :self.out_features] + halves[..., self.out_features:]
        return y if bias is None else y.add_(bias)


class CpuSplitInt8Method:
    """On a CPU: the halves through the int4 kernel, and steps that dequantize (`cpu_paths`)
    dequantize the int8 weight itself, so no copy of the halves is kept to dequantize from. A
    tied vocabulary's int8 weight is the embedding table's own tensors: no copy at all."""

    __slots__ = ("halves", "out_features", "policy", "weight")

    def __init__(self, halves: CpuInt4Method, weight: Int8Weight, policy: CpuPathPolicy) -> None:
        assert halves.source is None, "the halves keep no source: the int8 weight is it"
        self.halves = halves
        self.out_features = weight.shape[0]
        self.policy = policy
        self.weight = weight if policy.dequantize_from_rows is not None else None

    def apply(self, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        return cpu_paths.apply(self, x, bias)

    def kernel(self, x: torch.Tensor) -> torch.Tensor:
        halves = self.halves.kernel(x)
        return halves[..., :self.out_features] + halves[..., self.out_features:]

    def dequantized(self, dtype: torch.dtype) -> torch.Tensor:
        assert self.weight is not None, "built with a policy that never dequantizes"
        return self.policy.workspace.dequantize(self.weight, dtype)
