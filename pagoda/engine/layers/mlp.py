"""The gated MLP of every decoder family here: act(gate) * up, then down. SwiGLU (SiLU: Llama,
Qwen, Phi, SmolLM) or GeGLU with tanh-approximated GELU (Gemma)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from pagoda.engine.errors import ModelLoadError
from pagoda.engine.layers.linear import Linear
from pagoda.kernels.kernel_ops import KernelOps

ACTIVATIONS = ("silu", "gelu_tanh")
# config.json's names for them (hidden_act / hidden_activation).
_CONFIG_NAMES = {"silu": "silu", "swish": "silu", "gelu_pytorch_tanh": "gelu_tanh",
                 "gelu_tanh": "gelu_tanh"}


@dataclass(slots=True)
class GatedMLP:
    gate_up_proj: Linear  # gate and up in one matmul
    down_proj: Linear
    activation: str

    def __call__(self, x: torch.Tensor, ops: KernelOps) -> torch.Tensor:
        return self.down_proj(activation_and_mul(self.gate_up_proj(x), self.activation, ops))


def activation_and_mul(gate_up: torch.Tensor, activation: str, ops: KernelOps) -> torch.Tensor:
    """act(gate) * up of [rows, 2 x width] gate and up side by side (activation: one of
    ACTIVATIONS)."""
    if activation == "silu":
        return ops.silu_and_mul(gate_up)
    return ops.gelu_tanh_and_mul(gate_up)


def activation_of(name: str | None, family: str) -> str:
    """config.json's activation name -> one of ACTIVATIONS, or a clear refusal."""
    activation = _CONFIG_NAMES.get(name or "silu")
    if activation is None:
        raise ModelLoadError(f"This {family} model's MLP uses the activation {name!r}, which "
                             f"Pagoda does not run (it runs {', '.join(_CONFIG_NAMES)}).")
    return activation
