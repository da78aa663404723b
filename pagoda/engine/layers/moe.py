"""The sparse MLP of a mixture-of-experts model: a router picks each token's top k experts and
their outputs are added, weighted by the router's scores; a shared expert, where the model has
one, sees every token.

The routed experts are applied through an `ExpertsMethod` (as a linear layer's weights are
through a `LinearMethod`): the layer hands it the rows and their experts, and the method owns how
the experts' weights are kept and read. `experts_method_for` is the one place that chooses it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import torch

from pagoda.engine.layers.linear import Linear, Placement, make_fused_linear, make_linear, to_device
from pagoda.engine.layers.mlp import ACTIVATIONS, GatedMLP, activation_and_mul
from pagoda.engine.quantization.cpu_experts import in_place_experts
from pagoda.engine.quantization.tensors import Weight
from pagoda.engine.quantization.unquantized import UnquantizedMethod
from pagoda.kernels import torch_ref
from pagoda.kernels.kernel_ops import KernelOps

SCORINGS = ("softmax", "sigmoid")
# gpt-oss's clamped SwiGLU beside the gated MLP's own.
EXPERT_ACTIVATIONS = (*ACTIVATIONS, "swiglu_oai")


@dataclass(frozen=True, slots=True)
class ExpertActivation:
    """act(gate) * up of an expert's [rows, 2 x width] gate and up side by side. "swiglu_oai"
    (gpt-oss): gate clamped to at most `limit`, up to [-limit, limit], then
    gate * sigmoid(alpha * gate) * (up + 1)."""

    name: str = "silu"
    limit: float | None = None
    alpha: float | None = None

    def __post_init__(self) -> None:
        if self.name not in EXPERT_ACTIVATIONS:
            raise ValueError(f"unknown expert activation {self.name!r}")
        if self.name == "swiglu_oai" and (self.limit is None or self.alpha is None):
            raise ValueError("swiglu_oai needs its limit and alpha")

    def __call__(self, gate_up: torch.Tensor, ops: KernelOps) -> torch.Tensor:
        if self.name != "swiglu_oai":
            return activation_and_mul(gate_up, self.name, ops)
        gate, up = gate_up.chunk(2, dim=-1)
        gate = gate.clamp(max=self.limit)
        up = up.clamp(min=-self.limit, max=self.limit)
        return gate * torch.sigmoid(gate * self.alpha) * (up + 1)


@dataclass(slots=True)
class Router:
    """Each row's top k experts and their weights (float32) from a [experts, hidden]
    projection: softmax or sigmoid scores, optionally renormalised to sum to 1 over the k; or
    (`softmax_after_top_k`, gpt-oss) the k best logits, softmaxed among themselves."""

    gate: Linear
    top_k: int
    scoring: str = "softmax"
    renormalize: bool = False
    softmax_after_top_k: bool = False

    def __post_init__(self) -> None:
        if self.scoring not in SCORINGS:
            raise ValueError(f"unknown router scoring {self.scoring!r}")

    def __call__(self, x: torch.Tensor, ops: KernelOps) -> tuple[torch.Tensor, torch.Tensor]:
        """A float router through the backend's `route` (on a CPU our C one, which the
        one-call decode step shares); a quantized one through its linear, routed by torch."""
        weight = float_weight(self.gate)
        if weight is None:
            return torch_ref.route_logits(self.gate(x).float(), self.top_k, self.scoring,
                                          self.renormalize, self.softmax_after_top_k)
        return ops.route(x, weight, self.gate.bias, self.top_k, self.scoring, self.renormalize,
                         self.softmax_after_top_k)


def float_weight(linear: Linear) -> torch.Tensor | None:
    """The weight of a linear kept as a plain float tensor, else None."""
    method = linear.method
    return method.weight if isinstance(method, UnquantizedMethod) else None


class ExpertsMethod(Protocol):
    """Applies a layer's routed experts: [m, hidden] rows, each row's k weights (float32) and
    expert ids [m, k] -> [m, hidden], the weighted sum of each row's experts' outputs."""

    def apply(self, x: torch.Tensor, topk_weights: torch.Tensor,
              topk_ids: torch.Tensor) -> torch.Tensor: ...


@dataclass(frozen=True, slots=True)
class ExpertWeights:
    """One expert's weights as the loader gave them (views into a file's 3-D tensor or a
    folder's own tensors); biases where the experts have them (gpt-oss)."""

    gate: Weight
    up: Weight
    down: Weight
    gate_bias: torch.Tensor | None = None
    up_bias: torch.Tensor | None = None
    down_bias: torch.Tensor | None = None


@dataclass(slots=True)
class Expert:
    gate_up_proj: Linear  # gate and up in one matmul
    down_proj: Linear


class GroupedExperts:
    """The rows of the whole step grouped by expert: each active expert runs once, on all the
    rows routed to it (gate and up fused), through the linear methods its weights' layout
    chose. Each row's k outputs are then summed in the row's own top-k order, so a row's
    result does not depend on which other rows share the step."""

    def __init__(self, experts: list[Expert], activation: ExpertActivation,
                 ops: KernelOps) -> None:
        self.experts = experts
        self.activation = activation
        self.ops = ops

    def apply(self, x: torch.Tensor, topk_weights: torch.Tensor,
              topk_ids: torch.Tensor) -> torch.Tensor:
        m, k = topk_ids.shape
        flat_ids = topk_ids.flatten()
        by_expert = flat_ids.argsort(stable=True)  # the (row, slot) pairs, expert by expert
        rows = by_expert // k
        counts = torch.bincount(flat_ids, minlength=len(self.experts)).tolist()
        outputs = x.new_empty((m * k, x.shape[-1]))
        start = 0
        for expert, count in zip(self.experts, counts, strict=True):
            if not count:
                continue
            pairs = slice(start, start + count)
            gate_up = expert.gate_up_proj(x[rows[pairs]])
            outputs[by_expert[pairs]] = expert.down_proj(self.activation(gate_up, self.ops))
            start += count
        weighted = outputs.view(m, k, -1) * topk_weights.to(x.dtype).unsqueeze(-1)
        return weighted.sum(dim=1)


def experts_method_for(experts: Sequence[ExpertWeights], activation: ExpertActivation,
                       placement: Placement) -> ExpertsMethod:
    """The one place that chooses how a layer's routed experts run, from their weights' layout,
    the device and the kernels: on a CPU, a GGUF file's experts read in place by our kernel
    (`cpu_experts`) where it serves them; on the Triton backend, the fused Triton kernel
    (`triton_experts`) where it serves them; else grouped through the linear methods."""
    method = None
    if placement.uses_cpu_kernels:
        method = in_place_experts(experts, activation.name, activation.limit, activation.alpha)
    elif placement.ops.name == "triton":
        from pagoda.engine.quantization.triton_experts import triton_experts  # imports triton

        method = triton_experts(experts, activation.name, activation.limit, activation.alpha,
                                placement.device, placement.dtype, to_device)
    if method is not None:
        return method
    return GroupedExperts([_expert(w, placement) for w in experts], activation, placement.ops)


def _expert(weights: ExpertWeights, placement: Placement) -> Expert:
    bias = (None if weights.gate_bias is None
            else torch.cat((weights.gate_bias, weights.up_bias)))
    return Expert(make_fused_linear([weights.gate, weights.up], bias, placement),
                  make_linear(weights.down, weights.down_bias, placement))


@dataclass(slots=True)
class SparseMoE:
    """A sparse MLP: the routed experts' weighted outputs, plus the shared expert's (times
    sigmoid(shared_gate(x)) where it has a gate)."""

    router: Router
    experts: ExpertsMethod
    shared: GatedMLP | None = None
    shared_gate: Linear | None = None

    def __call__(self, x: torch.Tensor, ops: KernelOps) -> torch.Tensor:
        weights, ids = self.router(x, ops)
        out = self.experts.apply(x, weights, ids)
        if self.shared is None:
            return out
        shared = self.shared(x, ops)
        if self.shared_gate is None:
            return out + shared
        gate = float_weight(self.shared_gate)
        if gate is None or self.shared_gate.bias is not None:
            return out + shared * torch.sigmoid(self.shared_gate(x))
        return ops.add_sigmoid_gated(out, shared, x, gate)
