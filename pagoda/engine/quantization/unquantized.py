"""Float weights at the compute dtype: today's path and the parity reference."""

from __future__ import annotations

import torch
import torch.nn.functional as F


class UnquantizedMethod:
    __slots__ = ("weight",)

    def __init__(self, weight: torch.Tensor) -> None:
        self.weight = weight

    def apply(self, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        return F.linear(x, self.weight, bias)
