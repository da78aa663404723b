"""A GGUF file's experts, kept in place, run on the CPU through moe_experts
(pagoda/engine/quantization/cpu_experts.py), chosen by the layer's one method-choice function; other
experts, and paths without our kernels, keep the grouped method on the decoded weights."""

import dataclasses

import pytest
import torch
from expert_blocks import expert_blocks, experts_reference

from pagoda.engine.layers.linear import Placement
from pagoda.engine.layers.moe import ExpertActivation, ExpertWeights, GroupedExperts, experts_method_for
from pagoda.engine.quantization import cpu_experts
from pagoda.engine.quantization.cpu_experts import CpuExpertsMethod
from pagoda.engine.quantization.expert_weights import expert_weight
from pagoda.engine.quantization.native_kernels import load_native
from pagoda.kernels.kernel_ops import TORCH_OPS

HIDDEN, WIDTH, EXPERTS, TOP_K = 256, 256, 4, 2
CPU = Placement(torch.device("cpu"), torch.float32, TORCH_OPS)
# int8 activations (a scale per 256 values for K-quants) round each projection's input by ~1%
# on these random blocks; tests/kernels/test_moe_experts.py holds the kernel to its rounding.
ROUNDING = 0.04


@pytest.fixture(scope="module", autouse=True)
def kernel():
    if load_native("moe_experts") is None:
        pytest.skip("pagoda/kernels/cpu/moe_experts.c does not build here")


def _experts(gate_kind: str = "Q4_K", down_kind: str = "Q6_K", biases: bool = False):
    g = torch.Generator().manual_seed(1)
    experts = []
    for e in range(EXPERTS):
        bias = (lambda n: 0.1 * torch.randn(n, generator=g)) if biases else (lambda n: None)
        experts.append(ExpertWeights(
            expert_weight(expert_blocks(gate_kind, WIDTH, HIDDEN, seed=3 * e), gate_kind),
            expert_weight(expert_blocks(gate_kind, WIDTH, HIDDEN, seed=3 * e + 1), gate_kind),
            expert_weight(expert_blocks(down_kind, HIDDEN, WIDTH, seed=3 * e + 2), down_kind),
            bias(WIDTH), bias(WIDTH), bias(HIDDEN)))
    return experts


def _routing(m: int):
    g = torch.Generator().manual_seed(m)
    ids = torch.stack([torch.randperm(EXPERTS, generator=g)[:TOP_K] for _ in range(m)])
    return torch.softmax(torch.randn(m, TOP_K, generator=g), -1), ids


@pytest.mark.parametrize("kinds,activation", [
    (("Q4_K", "Q6_K"), ExpertActivation()),
    (("MXFP4", "MXFP4"), ExpertActivation("swiglu_oai", limit=7.0, alpha=1.702)),
], ids=["qwen3-moe-q4_k_m", "gpt-oss-mxfp4"])
def test_in_place_experts_on_a_cpu_run_the_kernel_and_give_the_layers_output(kinds, activation):
    experts = _experts(*kinds, biases=activation.name == "swiglu_oai")
    method = experts_method_for(experts, activation, CPU)
    assert isinstance(method, CpuExpertsMethod)
    x = torch.randn(5, HIDDEN, generator=torch.Generator().manual_seed(2))
    weights, ids = _routing(5)
    got = method.apply(x, weights, ids).double()
    want = experts_reference(experts, activation, x, weights, ids)
    assert ((got - want).norm(dim=-1) / want.norm(dim=-1)).max() < ROUNDING


def test_where_our_kernels_do_not_run_the_same_experts_run_decoded():
    """A GPU's placement (or any not on PyTorch's CPU kernels) takes the grouped method on the
    experts' decoded layout where the fused Triton kernel does not serve them (GeLU experts)."""
    experts = _experts()
    gelu = ExpertActivation("gelu_tanh")
    placement = dataclasses.replace(CPU, ops=dataclasses.replace(TORCH_OPS, name="triton"))
    method = experts_method_for(experts, gelu, placement)
    assert isinstance(method, GroupedExperts)
    x = torch.randn(3, HIDDEN, generator=torch.Generator().manual_seed(3))
    weights, ids = _routing(3)
    got = method.apply(x, weights, ids).double()
    want = experts_reference(experts, gelu, x, weights, ids)
    assert ((got - want).norm(dim=-1) / want.norm(dim=-1)).max() < ROUNDING


def test_float_experts_keep_the_grouped_method():
    g = torch.Generator().manual_seed(4)
    experts = [ExpertWeights(torch.randn(WIDTH, HIDDEN, generator=g),
                             torch.randn(WIDTH, HIDDEN, generator=g),
                             torch.randn(HIDDEN, WIDTH, generator=g)) for _ in range(EXPERTS)]
    assert isinstance(experts_method_for(experts, ExpertActivation(), CPU), GroupedExperts)


def test_a_batch_gives_each_row_what_it_gets_alone(monkeypatch):
    """Across the slices a long step goes in, too."""
    monkeypatch.setattr(cpu_experts, "ROWS_A_CALL", 4)
    method = experts_method_for(_experts(), ExpertActivation(), CPU)
    x = torch.randn(6, HIDDEN, generator=torch.Generator().manual_seed(5))
    weights, ids = _routing(6)
    batch = method.apply(x, weights, ids)
    for r in range(6):
        assert torch.equal(batch[r], method.apply(x[r:r + 1], weights[r:r + 1], ids[r:r + 1])[0])
