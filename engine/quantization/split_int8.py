"""Grouped int8 weights (GGUF's Q8_0, "int8" quantized on load) through an int4 kernel.

PyTorch's int8 CPU kernel takes one scale per output channel, which loses most of what groups of
32 keep (per-channel int8 agreed with the dequantized default model on 96.4% of next tokens).
Split into high and low nibbles (`split_int8_into_int4`), the weight is exactly two int4 weights
stacked along the output dimension: one int4 matmul over both, then the halves' outputs added.
It reads the same bytes as int8 would, and the int4 kernels are the faster ones.
"""

from __future__ import annotations

import torch

from engine.layers.linear import LinearMethod


class SplitInt8Method:
    __slots__ = ("inner", "out_features")

    def __init__(self, inner: LinearMethod, out_features: int) -> None:
        self.inner = inner
        self.out_features = out_features

    def apply(self, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        halves = self.inner.apply(x, None)
        y = halves[..., :self.out_features] + halves[..., self.out_features:]
        return y if bias is None else y.add_(bias)
