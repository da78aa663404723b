"""Quantized weights: CPU linear methods against dequantize-then-matmul, the load-time choice
of path, quantize-on-load, and quality against the dequantized model."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from gguf import GGMLQuantizationType as QType
from tiny_gguf import random_blocks

from pagoda.engine.config import EngineConfig
from pagoda.engine.layers.linear import Placement, make_linear
from pagoda.engine.layers.lm_head import refine_top_logits
from pagoda.engine.loading.loader import load_model, tokenizer_folder
from pagoda.engine.loading.on_load import apply_quantization
from pagoda.engine.quantization import cpu_paths
from pagoda.engine.quantization.cpu_int4 import CpuInt4Method
from pagoda.engine.quantization.cpu_int8 import CpuInt8Method
from pagoda.engine.quantization.cpu_paths import CpuPathPolicy, RowTimings
from pagoda.engine.quantization.dequantize_workspace import DequantWorkspace
from pagoda.engine.quantization.tensors import (
    Int4Weight,
    Int8Weight,
    Q6KWeight,
    concat,
    dequantize,
    k_quant_scales,
    quantize_int4,
    quantize_int8,
    split_int8_into_int4,
)
from pagoda.engine.worker.evaluation import compare, prompt_logits
from pagoda.engine.worker.model_runner import ModelRunner
from pagoda.kernels.kernel_ops import TORCH_OPS
from tests.engine.tiny_models import save_tiny_model
from tests.q4_k_weight import q4_k_weight

QUALITY_TEXT = Path(__file__).parents[1] / "data" / "quality_text.txt"


def _reference(x: torch.Tensor, weight, bias: torch.Tensor | None) -> torch.Tensor:
    return F.linear(x, dequantize(weight), bias)


def _assert_close_at_bf16(got: torch.Tensor, want: torch.Tensor) -> None:
    # bf16 activations, scales and outputs: about 3 significant digits of the output's scale.
    assert (got - want).abs().max() <= 2e-2 * want.abs().max()


@pytest.mark.parametrize("quantize, method", [(quantize_int4, CpuInt4Method),
                                              (quantize_int8, CpuInt8Method)])
@pytest.mark.parametrize("rows", [1, 7])
def test_cpu_quantized_linear_matches_dequantize_then_matmul(quantize, method, rows):
    torch.manual_seed(0)
    weight = quantize(torch.randn(40, 96))  # 40 outputs: not a multiple of the kernel's 16
    x, bias = torch.randn(rows, 96), torch.randn(40)
    got = method(weight).apply(x, bias)
    assert got.dtype == torch.float32 and got.shape == (rows, 40)
    _assert_close_at_bf16(got, _reference(x, weight, bias))


@pytest.mark.parametrize("quantize, method", [(quantize_int4, CpuInt4Method),
                                              (quantize_int8, CpuInt8Method)])
def test_dequantizing_path_in_fp32_is_the_exact_product(quantize, method):
    torch.manual_seed(1)
    weight = quantize(torch.randn(48, 64))
    layer = method(weight, CpuPathPolicy(dequantize_from_rows=4, gemm_dtype=torch.float32))
    x = torch.randn(5, 64)
    torch.testing.assert_close(layer.apply(x, None), _reference(x, weight, None))


def test_steps_below_the_threshold_use_the_kernel():
    torch.manual_seed(2)
    layer = CpuInt4Method(quantize_int4(torch.randn(32, 64)),
                          CpuPathPolicy(dequantize_from_rows=4, gemm_dtype=torch.float32))
    x = torch.randn(3, 64)
    torch.testing.assert_close(layer.apply(x, None), layer.kernel(x))


def _timings(by_rows: dict[int, tuple[float, float, float]]) -> dict[int, RowTimings]:
    """PyTorch's int4 kernel, fp32 GEMM and bf16 GEMM seconds by rows; no q4_gemv."""
    return {m: RowTimings(pack, None, fp32, bf16) for m, (pack, fp32, bf16) in by_rows.items()}


def test_policy_keeps_the_kernel_where_it_beats_both_gemms():
    # (kernel, fp32 GEMM, bf16 GEMM) seconds by rows.
    policy = cpu_paths._policy_from_timings(_timings({16: (1, 4, 3), 64: (2, 5, 3),
                                                      256: (3, 9, 3)}))
    assert policy.dequantize_from_rows is None


def test_policy_dequantizes_to_bf16_where_only_a_bf16_gemm_beats_the_kernel():
    # An AVX512-BF16 machine's shape (a Zen 5 EPYC measured 4x fp32's speed): the kernel
    # beats fp32 at every count, and loses to bf16 from 256 rows.
    policy = cpu_paths._policy_from_timings(_timings({16: (1, 4, 3), 64: (2, 5, 3),
                                                      256: (6, 9, 3)}))
    assert policy.dequantize_from_rows == 256 and policy.gemm_dtype == torch.bfloat16


def test_policy_dequantizes_from_where_the_kernel_loses_to_fp32():
    # An AVX2 machine's shape: the kernel wins small steps and loses large ones.
    policy = cpu_paths._policy_from_timings(_timings({16: (1, 2, 8), 64: (5, 3, 9),
                                                      256: (20, 9, 30)}))
    assert policy.dequantize_from_rows == 64 and policy.gemm_dtype == torch.float32


def test_policy_runs_the_faster_gemm_dtype_once_dequantizing():
    policy = cpu_paths._policy_from_timings(_timings({16: (9, 4, 2), 64: (20, 8, 3)}))
    assert policy.dequantize_from_rows == 16 and policy.gemm_dtype == torch.bfloat16


def test_a_layer_that_never_dequantizes_keeps_no_copy_to_dequantize_from():
    layer = CpuInt4Method(quantize_int4(torch.randn(32, 64)), CpuPathPolicy())
    assert layer.source is None
    x = torch.randn(300, 64)
    torch.testing.assert_close(layer.apply(x, None), layer.kernel(x))


def test_engine_that_loads_its_model_hands_the_loaders_weights_to_the_layers(tiny_llama):
    loaded = load_model(tiny_llama, quantization="int4")
    ModelRunner(loaded, EngineConfig(num_kv_blocks=8), release_weights=True)
    assert loaded.weights == {}


def test_int4_on_load_keeps_the_vocabulary_int8_and_norms_float():
    norm = torch.randn(32)
    weights = {"model.embed_tokens.weight": torch.randn(64, 32),
               "model.layers.0.mlp.up_proj.weight": torch.randn(48, 64),
               "model.layers.0.mlp.odd_proj.weight": torch.randn(48, 40),  # 40 % 32 != 0
               "model.layers.0.input_layernorm.weight": norm}
    out = apply_quantization(weights, "int4")
    assert isinstance(out["model.embed_tokens.weight"], Int8Weight)
    assert isinstance(out["model.layers.0.mlp.up_proj.weight"], Int4Weight)
    assert isinstance(out["model.layers.0.mlp.odd_proj.weight"], Int8Weight)
    assert out["model.layers.0.input_layernorm.weight"] is norm


def test_quantization_on_load_converts_each_weight_when_first_asked_for():
    weights = {"a": torch.randn(32, 64), "b": torch.randn(32, 64)}
    out = apply_quantization(weights, "int8")
    assert set(out) == {"a", "b"} and len(weights) == 2
    assert isinstance(out["a"], Int8Weight) and set(weights) == {"b"}  # the float copy let go
    del out["a"]
    assert set(out) == {"b"}


def test_none_dequantizes_every_quantized_weight():
    w = torch.randn(32, 64)
    out = apply_quantization({"a": quantize_int4(w), "b": quantize_int8(w), "c": w}, "none")
    assert all(isinstance(v, torch.Tensor) for v in out.values())
    torch.testing.assert_close(out["a"], dequantize(quantize_int4(w)))


def test_fusing_per_channel_int8_with_int4_keeps_every_value_close():
    torch.manual_seed(3)
    q, v = torch.randn(32, 64), torch.randn(16, 64)
    fused = concat([quantize_int4(q), quantize_int8(v)])
    assert isinstance(fused, Int8Weight) and fused.shape == (48, 64)
    want = torch.cat([dequantize(quantize_int4(q)), dequantize(quantize_int8(v))])
    assert (dequantize(fused) - want).abs().max() <= want.abs().max() / 127


@pytest.mark.parametrize("asymmetric", [False, True])
def test_fusing_int4_with_grouped_int8_keeps_every_value_exactly(asymmetric):
    """A Q4_K_M file's q and k projections (Q4_K) beside its v (Q6_K, read as grouped int8)."""
    torch.manual_seed(3)
    q, k, v = torch.randn(32, 64), torch.randn(8, 64), torch.randn(8, 64)
    parts = [quantize_int4(q), quantize_int4(k), quantize_int8(v, 32, asymmetric)]
    fused = concat(parts)
    assert isinstance(fused, Int8Weight) and fused.group_size == 32 and fused.shape == (48, 64)
    assert torch.equal(dequantize(fused), torch.cat([dequantize(p) for p in parts]))


def test_linear_off_the_fast_cpu_path_goes_through_the_kernel_dispatch():
    torch.manual_seed(4)
    weight = quantize_int4(torch.randn(32, 64))
    placement = Placement(torch.device("cpu"), torch.float32,
                          dataclasses.replace(TORCH_OPS, name="triton-like"))
    layer = make_linear(weight, None, placement)
    x = torch.randn(2, 64)
    torch.testing.assert_close(layer(x), _reference(x, weight, None))


@pytest.fixture(scope="module")
def tiny_llama(tmp_path_factory) -> Path:
    return save_tiny_model(tmp_path_factory.mktemp("llama-q"), "llama", tokenizer_folder())


def _logits(loaded, token_ids: list[int]) -> torch.Tensor:
    return prompt_logits(ModelRunner(loaded, EngineConfig(num_kv_blocks=64)), token_ids)


def _mean_relative_error(got: torch.Tensor, want: torch.Tensor) -> float:
    return ((got - want).norm(dim=-1) / want.norm(dim=-1)).mean().item()


@pytest.mark.parametrize("quantization", ["int8", "int4"])
def test_quantized_model_computes_what_its_dequantized_weights_do(tiny_llama, quantization):
    quantized = load_model(tiny_llama, quantization=quantization)
    assert not any(isinstance(w, torch.Tensor) and w.ndim == 2
                   for w in quantized.weights.values())
    dequantized = dataclasses.replace(quantized,
                                      weights=apply_quantization(quantized.weights, "none"))
    token_ids = quantized.tokenizer.encode(QUALITY_TEXT.read_text(encoding="utf-8"))[:300]
    error = _mean_relative_error(_logits(quantized, token_ids), _logits(dequantized, token_ids))
    assert 0 < error < 0.03  # bf16 activations around the kernels, nothing more


def test_int8_on_load_stays_close_to_the_float_model(tiny_llama):
    reference = load_model(tiny_llama, quantization="none")
    token_ids = reference.tokenizer.encode(QUALITY_TEXT.read_text(encoding="utf-8"))[:300]
    error = _mean_relative_error(_logits(load_model(tiny_llama, quantization="int8"), token_ids),
                                 _logits(reference, token_ids))
    assert error < 0.1


@pytest.mark.slow
@pytest.mark.parametrize("quantization, layers, min_agreement, native", [
    ("auto", Int4Weight, 0.98, "1"),  # its own Q4_1 bits through q4_gemv; measured 100.0%
    ("auto", Int4Weight, 0.98, "0"),  # through PyTorch's int4 kernel; measured 99.0%
    ("int8", Int8Weight, 0.99, "1"),  # quantized on load; measured 99.3% (PyTorch's kernel)
])  # (measured over the whole text; over its head here, each no lower than over the whole)
def test_default_model_quantized_predicts_like_dequantized(quality_reference_head, quantization,
                                                           layers, min_agreement, native,
                                                           monkeypatch):
    """Teacher-forced over the quality text's first 1,536 tokens (English and the start of its
    Chinese; its whole 2,561 took ~20 s a case in CI), against the same model with every
    weight dequantized (issue 11's targets: 98% top-1 in its own quantization, 99% at int8,
    perplexity within 2%), with our C kernels where they build and without them."""
    monkeypatch.setenv("PAGODA_NATIVE_KERNELS", native)
    token_ids, want = quality_reference_head
    quantized = load_model(quantization=quantization)
    assert isinstance(quantized.weights["model.layers.0.mlp.up_proj.weight"], layers)
    got = prompt_logits(ModelRunner(quantized, EngineConfig(num_kv_blocks=200)), token_ids)
    report = compare(want, got, token_ids)
    assert report.top1_agreement >= min_agreement
    assert abs(report.perplexity_ratio - 1) < 0.02


def test_refined_logits_are_exact_for_the_top_candidates():
    torch.manual_seed(5)
    exact = quantize_int8(torch.randn(500, 64), group_size=32)
    x = torch.randn(3, 64)
    want = F.linear(x, dequantize(exact))
    coarse = (want + 0.3 * torch.randn_like(want)).bfloat16().float()  # rounded, noisy logits
    top = coarse.topk(32, dim=-1).indices
    refined = refine_top_logits(coarse.clone(), x, exact, k=32)
    torch.testing.assert_close(refined.gather(1, top), want.gather(1, top))
    assert torch.equal(refined.argmax(-1), want.argmax(-1))


def _q6_k_vocabulary(n: int, k: int) -> Q6KWeight:
    blocks = random_blocks(QType.Q6_K, n, k, np.random.default_rng(7))
    return Q6KWeight(torch.from_numpy(np.ascontiguousarray(blocks)))


@pytest.mark.parametrize("kind", ["int8", "int4", "q6_k"])
def test_top_candidates_widened_by_our_kernel_are_torchs_exact_rows(kind):
    widen = DequantWorkspace.for_this_machine()
    if not widen.native:
        pytest.skip("our dequant kernel does not build here (so torch widens the rows)")
    torch.manual_seed(8)
    exact = {"int8": lambda: quantize_int8(torch.randn(700, 256), group_size=32),
             "int4": lambda: quantize_int4(torch.randn(700, 256), group_size=32),
             "q6_k": lambda: _q6_k_vocabulary(700, 256)}[kind]()
    x = torch.randn(3, 256)
    coarse = (F.linear(x, dequantize(exact)) + 0.3 * torch.randn(3, 700)).bfloat16().float()
    by_torch = refine_top_logits(coarse.clone(), x, exact, k=32)
    by_kernel = refine_top_logits(coarse.clone(), x, exact, k=32, widen=widen)
    assert not torch.equal(by_torch, coarse)  # the candidates were recomputed
    assert torch.equal(by_kernel, by_torch)


def test_tied_quantized_vocabulary_is_refined_from_the_embedding_itself(tiny_llama):
    model = ModelRunner(load_model(tiny_llama, quantization="int8"),
                        EngineConfig(num_kv_blocks=8)).model
    assert isinstance(model.lm_head.exact, Int8Weight)
    assert model.lm_head.exact.q is model.embed_tokens.weight.q


@pytest.mark.parametrize("asymmetric", [False, True])
def test_grouped_int8_split_into_int4_halves_adds_up_to_the_same_weights(asymmetric):
    torch.manual_seed(6)
    weight = quantize_int8(torch.randn(40, 64) + 2, group_size=32, asymmetric=asymmetric)
    halves = dequantize(split_int8_into_int4(weight))
    torch.testing.assert_close(halves[:40] + halves[40:], dequantize(weight))


def test_asymmetric_int8_groups_halve_the_error_of_values_off_zero():
    torch.manual_seed(7)
    w = torch.randn(64, 128) * 0.1 + 1.0
    symmetric = (dequantize(quantize_int8(w, 32)) - w).abs().max()
    asymmetric = (dequantize(quantize_int8(w, 32, asymmetric=True)) - w).abs().max()
    assert asymmetric < 0.6 * symmetric


def test_grouped_int8_linear_matches_dequantize_then_matmul():
    torch.manual_seed(8)
    weight = quantize_int8(torch.randn(40, 64), group_size=32, asymmetric=True)
    layer = make_linear(weight, None, Placement(torch.device("cpu"), torch.float32, TORCH_OPS))
    x = torch.randn(3, 64)
    _assert_close_at_bf16(layer(x), _reference(x, weight, None))


def test_split_activations_bring_the_int4_kernel_closer_to_the_exact_product():
    torch.manual_seed(9)
    weight = quantize_int4(torch.randn(64, 256))
    x = torch.randn(4, 256)
    want = _reference(x, weight, None)
    plain = (CpuInt4Method(weight).kernel(x) - want).abs().mean()
    split = (CpuInt4Method(weight, split_activations=True).kernel(x) - want).abs().mean()
    # The kernel still rounds its outputs to bf16: the inputs' share of the error goes.
    assert split < 0.95 * plain


def test_dequantizing_grouped_int8_layer_reads_its_int8_weight_not_a_copy_of_its_halves():
    torch.manual_seed(10)
    weight = quantize_int8(torch.randn(40, 64), group_size=32, asymmetric=True)
    policy = CpuPathPolicy(dequantize_from_rows=4, gemm_dtype=torch.float32)
    placement = Placement(torch.device("cpu"), torch.float32, TORCH_OPS, policy)
    method = make_linear(weight, None, placement).method
    assert method.weight.q is weight.q and method.halves.source is None
    x = torch.randn(5, 64)
    torch.testing.assert_close(method.apply(x, None), _reference(x, weight, None))


def test_grouped_int8_layer_that_never_dequantizes_keeps_only_the_kernels_halves():
    weight = quantize_int8(torch.randn(32, 64), group_size=32)
    placement = Placement(torch.device("cpu"), torch.float32, TORCH_OPS)
    method = make_linear(weight, None, placement).method
    assert method.weight is None and method.halves.source is None


def test_copy_to_dequantize_from_keeps_fp16_scales_where_they_are_exact():
    torch.manual_seed(11)
    weight = quantize_int4(torch.randn(32, 64))
    as_in_q4_1 = Int4Weight(weight.packed, weight.scales.half().float(),
                            weight.mins.half().float())
    policy = CpuPathPolicy(dequantize_from_rows=1)
    compact = CpuInt4Method(as_in_q4_1, policy).source
    assert compact.scales.dtype == compact.mins.dtype == torch.float16
    assert torch.equal(dequantize(compact), dequantize(as_in_q4_1))
    assert CpuInt4Method(weight, policy).source.scales.dtype == torch.float32  # not exact in fp16


def test_q4_k_scales_factor_back_into_the_files_six_bit_parts():
    weight, parts = q4_k_weight(12, 512)
    found = k_quant_scales(weight)
    assert found is not None
    for name in ("d", "dmin", "sc", "m"):
        assert torch.equal(getattr(found, name), getattr(parts, name)), name


@pytest.mark.parametrize("case", ["quantized on load", "a scale off the grid", "k of 288"])
def test_q4_k_scales_refuse_what_is_not_exactly_q4_k(case):
    weight, _ = q4_k_weight(12, 512)
    if case == "quantized on load":
        weight = quantize_int4(torch.randn(12, 512))
    elif case == "a scale off the grid":
        weight.scales[3, 9] *= 1.001
    else:
        weight = quantize_int4(torch.randn(12, 288))
    assert k_quant_scales(weight) is None
