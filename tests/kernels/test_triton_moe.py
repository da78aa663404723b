"""The fused Triton experts (pagoda/kernels/triton_moe.py through pagoda/engine/quantization/triton_experts.py):
each row gets the weighted sum of its k experts, as a plain per-row reference computes it on the
experts' dequantized values, for every weight layout and both activations; chosen for the
Triton backend by the layer's one method-choice function.

Tiny shapes: the interpreter runs each program in Python. 8 experts, top 2, and a step whose
rows share experts, leave experts without rows, and a step of one row.
"""

import pytest
import torch
from expert_blocks import expert_blocks, experts_reference
from kernel_device import DEVICE, assert_close

from pagoda.engine.layers.linear import Placement
from pagoda.engine.layers.moe import ExpertActivation, ExpertWeights, GroupedExperts, experts_method_for
from pagoda.engine.quantization.expert_weights import expert_weight
from pagoda.engine.quantization.tensors import quantize_int4, quantize_int8
from pagoda.engine.quantization.triton_experts import TritonExpertsMethod
from pagoda.kernels.kernel_ops import TORCH_OPS
from pagoda.kernels.ops import triton_ops
from pagoda.kernels.triton_moe import align_pairs

EXPERTS, TOP_K, HIDDEN, WIDTH = 8, 2, 64, 32
SILU = ExpertActivation()
# A limit low enough that both clamps bite on these values (gpt-oss: 7).
SWIGLU_OAI = ExpertActivation("swiglu_oai", limit=1.5, alpha=1.702)
# Rows 0-2 share expert 1, row 3 is alone on 6, experts 0, 4 and 5 get no row.
IDS = torch.tensor([[1, 3], [7, 1], [3, 1], [6, 2]])


def _float(w: torch.Tensor) -> torch.Tensor:
    return w


def _int8_per_channel(w: torch.Tensor) -> object:
    return quantize_int8(w)


def _int8_groups(w: torch.Tensor) -> object:
    return quantize_int8(w, 32)


LAYOUTS = {"float": _float, "int8": _int8_groups, "int8 per channel": _int8_per_channel,
           "int4": quantize_int4}


def _experts(layout: str, biases: bool) -> list[ExpertWeights]:
    g = torch.Generator().manual_seed(0)
    make = LAYOUTS[layout]

    def bias(n: int) -> torch.Tensor | None:
        return 0.5 * torch.randn(n, generator=g) if biases else None

    return [ExpertWeights(make(0.2 * torch.randn(WIDTH, HIDDEN, generator=g)),
                          make(0.2 * torch.randn(WIDTH, HIDDEN, generator=g)),
                          make(0.2 * torch.randn(HIDDEN, WIDTH, generator=g)),
                          bias(WIDTH), bias(WIDTH), bias(HIDDEN))
            for _ in range(EXPERTS)]


def _gguf_experts() -> list[ExpertWeights]:
    """A file's rows in place: Q4_0 gate and up (int4 decoded), MXFP4 down (grouped int8)."""
    return [ExpertWeights(expert_weight(expert_blocks("Q4_0", WIDTH, HIDDEN, 3 * e), "Q4_0"),
                          expert_weight(expert_blocks("Q4_0", WIDTH, HIDDEN, 3 * e + 1), "Q4_0"),
                          expert_weight(expert_blocks("MXFP4", HIDDEN, WIDTH, 3 * e + 2), "MXFP4"))
            for e in range(EXPERTS)]


def _step(rows: int, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(rows)
    x = torch.randn(rows, HIDDEN, generator=g)
    weights = torch.rand(rows, TOP_K, generator=g)
    return x.to(DEVICE, dtype), weights.to(DEVICE), IDS[:rows].to(DEVICE)


def _method(experts: list[ExpertWeights], activation: ExpertActivation,
            dtype: torch.dtype = torch.float32):
    return experts_method_for(experts, activation, Placement(DEVICE, dtype, triton_ops()))


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("activation", [SILU, SWIGLU_OAI], ids=lambda a: a.name)
def test_each_row_gets_its_experts_weighted_sum_in_every_layout(layout, activation):
    experts = _experts(layout, biases=activation is SWIGLU_OAI)
    method = _method(experts, activation)
    assert isinstance(method, TritonExpertsMethod)
    x, weights, ids = _step(4, torch.float32)
    assert_close(method.apply(x, weights, ids), experts_reference(experts, activation, x, weights, ids))


def test_a_gguf_files_experts_in_place_a_single_row_and_none():
    experts = _gguf_experts()
    method = _method(experts, SILU)
    for rows in (4, 1, 0):
        x, weights, ids = _step(rows, torch.float32)
        assert_close(method.apply(x, weights, ids), experts_reference(experts, SILU, x, weights, ids))


def test_fp16_activations_round_only_as_fp16_does():
    experts = _experts("int4", biases=True)
    x, weights, ids = _step(4, torch.float16)
    out = _method(experts, SWIGLU_OAI, torch.float16).apply(x, weights, ids)
    assert out.dtype == torch.float16
    torch.testing.assert_close(out.double().cpu(),
                               experts_reference(experts, SWIGLU_OAI, x, weights, ids),
                               atol=2e-2, rtol=2e-2)


def test_pairs_are_grouped_by_expert_in_whole_blocks():
    ids = IDS.to(torch.int32)  # any integer type
    pairs, block_experts = align_pairs(ids, EXPERTS, block_m=2)
    flat = ids.flatten()
    blocks = pairs.view(-1, 2)
    for block, expert in zip(blocks.tolist(), block_experts.tolist(), strict=True):
        real = [p for p in block if p < flat.numel()]
        assert all(int(flat[p]) == expert for p in real)
        assert expert >= 0 or not real
    # Every pair exactly once; expert 1's three pairs fill two blocks, each other's one.
    assert sorted(p for p in pairs.tolist() if p < flat.numel()) == list(range(flat.numel()))
    assert (block_experts >= 0).sum() == 6


def test_the_torch_path_and_unserved_experts_keep_the_grouped_method():
    experts = _experts("float", biases=False)
    torch_placement = Placement(torch.device("cpu"), torch.float32, TORCH_OPS)
    assert isinstance(experts_method_for(experts, SILU, torch_placement), GroupedExperts)
    gelu = ExpertActivation("gelu_tanh")
    assert isinstance(_method(experts, gelu), GroupedExperts)
    mixed = [ExpertWeights(quantize_int4(e.gate), quantize_int8(e.up, 32), e.down)
             for e in experts]
    assert isinstance(_method(mixed, SILU), GroupedExperts)
