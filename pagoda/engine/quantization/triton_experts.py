"""A mixture-of-experts layer's routed experts through the fused Triton kernel
(pagoda/kernels/triton_moe.py): each projection of every expert stacked into one [experts, ...] tensor
at load, in the layout the GPU's linears read (a GGUF file's rows decoded, its other block types
widened to grouped int8: `pagoda.engine.layers.linear.to_device`, which the layer passes in, as for
any weight).

`triton_experts` is what `pagoda.engine.layers.moe.experts_method_for` asks on the Triton backend; it
answers None (and the layer's grouped method runs) where the kernel does not serve the experts:
an activation other than SiLU and gpt-oss's clamped SwiGLU, or experts whose layouts differ.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable, Sequence

import torch

from pagoda.engine.quantization.cpu_experts import ExpertWeightsLike
from pagoda.engine.quantization.tensors import Int4Weight, Int8Weight, Weight
from pagoda.kernels.triton_moe import ACTIVATIONS, ExpertMatrices, fused_experts

logger = logging.getLogger(__name__)


class TritonExpertsMethod:
    """`ExpertsMethod` of a layer whose experts the fused Triton kernel runs."""

    __slots__ = ("activation", "alpha", "down", "gate_up", "limit")

    def __init__(self, gate_up: ExpertMatrices, down: ExpertMatrices, activation: str,
                 limit: float | None, alpha: float | None) -> None:
        self.gate_up = gate_up
        self.down = down
        self.activation = activation
        self.limit = limit or 0.0
        self.alpha = alpha or 0.0

    def apply(self, x: torch.Tensor, topk_weights: torch.Tensor,
              topk_ids: torch.Tensor) -> torch.Tensor:
        return fused_experts(x.contiguous(), topk_weights, topk_ids, self.gate_up, self.down,
                             self.activation, self.limit, self.alpha)


# A weight moved to the device in the layout the GPU's kernels read (linear.to_device).
ToDevice = Callable[[Weight, torch.device, torch.dtype], Weight]


def triton_experts(experts: Sequence[ExpertWeightsLike], activation: str, limit: float | None,
                   alpha: float | None, device: torch.device, dtype: torch.dtype,
                   to_device: ToDevice) -> TritonExpertsMethod | None:
    """The fused kernel's method for these experts on `device` at the compute dtype, or None
    where it does not serve them (the reason logged once per kind)."""
    if activation not in ACTIVATIONS:
        _log_once(f"the experts' activation is {activation}")
        return None
    gate_up = _stacked([[e.gate, e.up] for e in experts],
                       _biases(experts, ("gate_bias", "up_bias")), device, dtype, to_device)
    down = _stacked([[e.down] for e in experts], _biases(experts, ("down_bias",)), device, dtype,
                    to_device)
    if gate_up is None or down is None:
        _log_once("the experts' weights are not one layout (kind, group size, mins) throughout")
        return None
    return TritonExpertsMethod(gate_up, down, activation, limit, alpha)


def _biases(experts: Sequence[ExpertWeightsLike],
            names: tuple[str, ...]) -> list[torch.Tensor] | None:
    if getattr(experts[0], names[0]) is None:
        return None
    return [torch.cat([getattr(e, name) for name in names]) for e in experts]


def _stacked(parts: list[list[Weight]], biases: list[torch.Tensor] | None,
             device: torch.device, dtype: torch.dtype,
             to_device: ToDevice) -> ExpertMatrices | None:
    """Each expert's parts (gate and up, or down) one above the other, the experts stacked;
    None where they are not all one layout."""
    moved = [[to_device(w, device, dtype) for w in expert] for expert in parts]
    layouts = {_layout(w) for expert in moved for w in expert}
    if len(layouts) != 1:
        return None
    kind, group_size, has_mins = layouts.pop()
    bias = None if biases is None else _stack(biases, device, dtype)
    if kind == "float":
        return ExpertMatrices(kind, _stack([torch.cat(e) for e in moved], device, dtype),
                              bias=bias)

    def stacked(name: str) -> torch.Tensor:
        return _stack([torch.cat([_as_groups(getattr(w, name)) for w in e]) for e in moved],
                      device, None)

    values = stacked("packed" if kind == "int4" else "q")
    group_size = group_size or values.shape[-1]  # per channel: one group of all K inputs
    return ExpertMatrices(kind, values, stacked("scales"), stacked("mins") if has_mins else None,
                          group_size, bias)


def _layout(w: Weight) -> tuple[str, int | None, bool]:
    """(kind, inputs a group: None for per-channel int8, has mins) of a moved weight."""
    if isinstance(w, Int4Weight):
        return "int4", w.group_size, True
    if isinstance(w, Int8Weight):
        return "int8", w.group_size, w.mins is not None
    return "float", None, False


def _as_groups(t: torch.Tensor) -> torch.Tensor:
    """Per-channel int8's scales [N] as one group a row, [N, 1]; anything else as it is."""
    return t.unsqueeze(1) if t.dim() == 1 else t


def _stack(tensors: list[torch.Tensor], device: torch.device,
           dtype: torch.dtype | None) -> torch.Tensor:
    stacked = torch.stack(tensors).to(device)
    return (stacked if dtype is None else stacked.to(dtype)).contiguous()


@functools.cache
def _log_once(why: str) -> None:
    logger.info("Mixture-of-experts layers run the grouped method, not the fused Triton "
                "kernel: %s", why)
