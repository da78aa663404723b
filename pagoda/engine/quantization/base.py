"""The seam between a layer and its weights' format (vLLM's `LinearMethod`)."""

from __future__ import annotations

from typing import Protocol

import torch


class LinearMethod(Protocol):
    """Creates a layer's weights in the form its kernel wants and applies them."""

    def apply(self, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor: ...
