"""The sparse MLP (pagoda/engine/layers/moe.py) against a plain per-row torch reference: routing by
softmax or sigmoid scores, renormalised or not, gpt-oss's softmax after the top k, router and
expert biases, a gated shared expert; and a batch's rows each given what they get alone."""

import pytest
import torch
import transformers

from pagoda.engine.layers.linear import Placement, make_fused_linear, make_linear
from pagoda.engine.layers.mlp import GatedMLP
from pagoda.engine.layers.moe import (
    ExpertActivation,
    ExpertWeights,
    GroupedExperts,
    Router,
    SparseMoE,
    experts_method_for,
)
from pagoda.engine.quantization.tensors import dequantize, quantize_int8
from pagoda.kernels.kernel_ops import TORCH_OPS

HIDDEN, WIDTH, EXPERTS, SHARED = 32, 32, 8, 24
CPU = Placement(torch.device("cpu"), torch.float32, TORCH_OPS)


def _randn(*shape: int, generator: torch.Generator) -> torch.Tensor:
    return 0.3 * torch.randn(*shape, generator=generator)


@pytest.fixture(scope="module")
def weights() -> dict:
    g = torch.Generator().manual_seed(0)
    return {
        "router": _randn(EXPERTS, HIDDEN, generator=g) * 3,
        "router_bias": _randn(EXPERTS, generator=g),
        "experts": [{"gate": _randn(WIDTH, HIDDEN, generator=g),
                     "up": _randn(WIDTH, HIDDEN, generator=g),
                     "down": _randn(HIDDEN, WIDTH, generator=g),
                     "gate_bias": _randn(WIDTH, generator=g), "up_bias": _randn(WIDTH, generator=g),
                     "down_bias": _randn(HIDDEN, generator=g)} for _ in range(EXPERTS)],
        "shared": [_randn(SHARED, HIDDEN, generator=g), _randn(SHARED, HIDDEN, generator=g),
                   _randn(HIDDEN, SHARED, generator=g)],
        "shared_gate": _randn(1, HIDDEN, generator=g),
        "rows": torch.randn(12, HIDDEN, generator=g),
    }


def _layer(weights: dict, *, top_k: int = 2, scoring: str = "softmax",
           renormalize: bool = False, softmax_after_top_k: bool = False, biases: bool = False,
           shared: bool = False,
           quantize=lambda w: w) -> SparseMoE:
    router = Router(make_linear(weights["router"], weights["router_bias"] if biases else None, CPU),
                    top_k, scoring, renormalize, softmax_after_top_k)
    experts = [ExpertWeights(quantize(e["gate"]), quantize(e["up"]), quantize(e["down"]),
                             *((e["gate_bias"], e["up_bias"], e["down_bias"]) if biases else ()))
               for e in weights["experts"]]
    gate, up, down = weights["shared"]
    return SparseMoE(
        router, experts_method_for(experts, ExpertActivation(), CPU),
        GatedMLP(make_fused_linear([gate, up], None, CPU), make_linear(down, None, CPU), "silu")
        if shared else None,
        make_linear(weights["shared_gate"], None, CPU) if shared else None)


def _reference(weights: dict, rows: torch.Tensor, *, top_k: int = 2, scoring: str = "softmax",
               renormalize: bool = False, softmax_after_top_k: bool = False,
               biases: bool = False, shared: bool = False) -> torch.Tensor:
    """Row by row, expert by expert, as the model cards define the layer."""
    def linear(x, w, b=None):
        return x @ w.T + (b if b is not None and biases else 0)

    out = []
    for x in rows:
        logits = linear(x, weights["router"], weights["router_bias"])
        if softmax_after_top_k:
            best, ids = logits.topk(top_k)
            mix = best.softmax(-1)
        else:
            scores = logits.softmax(-1) if scoring == "softmax" else logits.sigmoid()
            mix, ids = scores.topk(top_k)
            if renormalize:
                mix = mix / mix.sum()
        y = torch.zeros(HIDDEN)
        for weight, e in zip(mix, ids.tolist(), strict=True):
            ex = weights["experts"][e]
            h = (torch.nn.functional.silu(linear(x, ex["gate"], ex["gate_bias"]))
                 * linear(x, ex["up"], ex["up_bias"]))
            y = y + weight * linear(h, ex["down"], ex["down_bias"])
        if shared:
            gate, up, down = weights["shared"]
            s = (torch.nn.functional.silu(x @ gate.T) * (x @ up.T)) @ down.T
            y = y + torch.sigmoid(x @ weights["shared_gate"].T) * s
        out.append(y)
    return torch.stack(out)


ROUTINGS = {
    "softmax top-2": {},
    "softmax top-4 renormalised": {"top_k": 4, "renormalize": True},
    "sigmoid top-2": {"scoring": "sigmoid"},
    "sigmoid top-4 renormalised": {"top_k": 4, "scoring": "sigmoid", "renormalize": True},
    "gpt-oss: softmax after top-4, biases": {"top_k": 4, "softmax_after_top_k": True,
                                             "biases": True},
    "with a gated shared expert": {"renormalize": True, "shared": True},
}


@pytest.mark.parametrize("routing", ROUTINGS.values(), ids=ROUTINGS.keys())
def test_the_sparse_mlp_equals_a_row_by_row_reference(weights, routing):
    ours = _layer(weights, **routing)(weights["rows"], TORCH_OPS)
    torch.testing.assert_close(ours, _reference(weights, weights["rows"], **routing),
                               atol=1e-5, rtol=1e-5)


def test_the_routing_choices_change_the_output(weights):
    """The reference tells the routings apart on these rows (so the test above can fail)."""
    rows = weights["rows"]
    outputs = [_reference(weights, rows, **routing) for routing in ROUTINGS.values()]
    for i, a in enumerate(outputs):
        for b in outputs[i + 1:]:
            assert not torch.allclose(a, b, atol=1e-3)


def test_each_row_of_a_batch_gets_what_it_gets_alone(weights):
    """The same experts and the same output, to the last bits a matmul's blocking changes
    between one row and twelve (another row's expert or weight would change it by ~1)."""
    layer = _layer(weights, top_k=2, renormalize=True)
    rows = weights["rows"]
    _, ids = layer.router(rows, TORCH_OPS)
    chosen = [set(row) for row in ids.tolist()]
    # Some rows share an expert and some share none: both kinds of grouping are exercised.
    assert any(a & b for i, a in enumerate(chosen) for b in chosen[i + 1:])
    assert any(not a & b for i, a in enumerate(chosen) for b in chosen[i + 1:])
    batch = layer(rows, TORCH_OPS)
    for i in range(len(rows)):
        assert layer.router(rows[i:i + 1], TORCH_OPS)[1].tolist() == [ids[i].tolist()]
        torch.testing.assert_close(batch[i], layer(rows[i:i + 1], TORCH_OPS)[0],
                                   atol=1e-5, rtol=1e-5)


def test_quantized_experts_run_through_their_linear_methods(weights):
    """int8 experts (grouped, as a GGUF Q8_0 file's) give the layer of their dequantized
    weights, to the kernels' rounding of activations."""
    int8 = _layer(weights, quantize=lambda w: quantize_int8(w, 32))
    assert isinstance(int8.experts, GroupedExperts)
    floats = _layer(weights, quantize=lambda w: dequantize(quantize_int8(w, 32)))
    want = floats(weights["rows"], TORCH_OPS)
    # The CPU int8 kernels round activations too (to 16 bits): within 1% of the largest output.
    assert (int8(weights["rows"], TORCH_OPS) - want).abs().max() < 0.01 * want.abs().max()


def test_gpt_oss_clamped_swiglu_equals_transformers():
    config = transformers.GptOssConfig(hidden_size=HIDDEN, intermediate_size=WIDTH,
                                       num_local_experts=2)
    theirs = transformers.models.gpt_oss.modeling_gpt_oss.GptOssExperts(config)
    gate_up = 6 * torch.randn(5, 2 * WIDTH, generator=torch.Generator().manual_seed(1))
    assert gate_up.abs().max() > config.swiglu_limit  # the clamp binds
    interleaved = torch.stack(gate_up.chunk(2, dim=-1), dim=-1).flatten(-2)  # gate, up, gate...
    ours = ExpertActivation("swiglu_oai", config.swiglu_limit, config.swiglu_alpha)
    torch.testing.assert_close(ours(gate_up, TORCH_OPS), theirs._apply_gate(interleaved))


def test_a_router_refuses_an_unknown_scoring(weights):
    with pytest.raises(ValueError, match="scoring"):
        Router(make_linear(weights["router"], None, CPU), 2, "relu")
