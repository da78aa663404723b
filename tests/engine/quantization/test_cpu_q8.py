"""Grouped int8 weights through our q8_gemv kernel: read in place (no int4 halves), the
vocabulary's int8 pass and the layers' int16 one, the load-time choice for layers, and the
fallback to halves without the library."""

from __future__ import annotations

import dataclasses

import pytest
import torch
import torch.nn.functional as F
from dequantized_self import greedy_tokens, logits_error
from gguf import GGMLQuantizationType as QType
from tiny_gguf import write_tiny_gguf

from pagoda.engine.config import EngineConfig
from pagoda.engine.layers.linear import Placement, make_linear
from pagoda.engine.loading.loader import load_model
from pagoda.engine.quantization import cpu_paths
from pagoda.engine.quantization.cpu_paths import CpuPathPolicy
from pagoda.engine.quantization.cpu_q8 import CpuQ8Method, Q8Context, load_q8_context
from pagoda.engine.quantization.split_int8 import CpuSplitInt8Method
from pagoda.engine.quantization.tensors import Int8Weight, dequantize, quantize_int8
from pagoda.engine.worker.model_runner import ModelRunner
from pagoda.kernels.cpu.native import find_compiler
from pagoda.kernels.cpu.q8_gemv import Q8Gemv
from pagoda.kernels.kernel_ops import TORCH_OPS


@pytest.fixture(scope="module")
def q8(kernel_build_dir) -> Q8Context:
    if find_compiler() is None:
        pytest.skip("no C compiler (gcc or $CC) to build pagoda/kernels/cpu/q8_gemv.c")
    lib = Q8Gemv.load(kernel_build_dir)
    if lib.best_isa() < 1:
        pytest.skip("this CPU lacks AVX2, so the engine keeps the int4 halves")
    return Q8Context(lib)


@pytest.fixture
def q8_chosen(monkeypatch, kernels_cache_dir, kernels_at_every_step):
    """The engine builds q8_gemv under the session's cache folder and its calibration picks it for
    the layers at every step size (`kernels_at_every_step`; the choice itself is tested on
    timings below)."""
    monkeypatch.setenv("PAGODA_CACHE_DIR", str(kernels_cache_dir))
    monkeypatch.setattr("pagoda.engine.quantization.native_kernels._unavailable", {})
    monkeypatch.setattr(cpu_paths, "choose_int8_kernel", lambda *args: (True, "chosen"))


@pytest.fixture(scope="module")
def tiny_q8_0(tmp_path_factory):
    """The tiny GGUF with every matrix in Q8_0: grouped int8 layers and a tied vocabulary."""
    path = tmp_path_factory.mktemp("tiny-q8") / "tiny.gguf"
    return write_tiny_gguf(path, matrix_type=QType.Q8_0).path


def _placement(q8: Q8Context, layers: bool) -> Placement:
    return Placement(torch.device("cpu"), torch.float32, TORCH_OPS, CpuPathPolicy(), q8=q8,
                     q8_layers=layers)


def _weight(asymmetric: bool = False) -> Int8Weight:
    torch.manual_seed(3)
    return quantize_int8(torch.randn(40, 64), group_size=32, asymmetric=asymmetric)


def _relative_error(got: torch.Tensor, want: torch.Tensor) -> float:
    return ((got - want).norm() / want.norm()).item()


@pytest.mark.parametrize("asymmetric", [False, True])
def test_grouped_int8_layer_through_q8_is_the_exact_product_to_16_bits(q8, asymmetric):
    weight = _weight(asymmetric)
    layer = make_linear(weight, None, _placement(q8, layers=True))
    assert isinstance(layer.method, CpuQ8Method)
    x = torch.randn(3, 64)
    assert _relative_error(layer(x), F.linear(x, dequantize(weight))) < 1e-4


def test_q8_reads_the_int8_weight_in_place(q8):
    weight = _weight()
    method = make_linear(weight, None, _placement(q8, layers=True)).method
    assert method.native.operand.q.data_ptr() == weight.q.data_ptr()
    assert method.native.operand.scales.data_ptr() == weight.scales.data_ptr()
    assert not hasattr(method, "halves")


def test_vocabulary_runs_q8s_int8_pass_even_where_layers_keep_their_halves(q8):
    weight = _weight()
    placement = _placement(q8, layers=False)
    vocabulary = make_linear(weight, None, placement, precise_int8=False)
    assert isinstance(vocabulary.method, CpuQ8Method)
    assert isinstance(make_linear(weight, None, placement).method, CpuSplitInt8Method)
    x = torch.randn(3, 64)
    assert _relative_error(vocabulary(x), F.linear(x, dequantize(weight))) < 2e-2


def test_vocabulary_logits_get_a_new_tensor_every_call(q8):
    vocabulary = make_linear(_weight(), None, _placement(q8, layers=False), precise_int8=False)
    x = torch.randn(1, 64)
    assert vocabulary(x).data_ptr() != vocabulary(x).data_ptr()


def test_q8_layer_dequantizes_its_own_int8_weight_for_the_steps_given_a_gemm(q8):
    weight = _weight(asymmetric=True)
    placement = dataclasses.replace(_placement(q8, layers=True),
                                    cpu_int4_policy=CpuPathPolicy(dequantize_from_rows=4))
    method = make_linear(weight, None, placement).method
    assert method.weight is weight
    x = torch.randn(5, 64)
    torch.testing.assert_close(method.apply(x, None), F.linear(x, dequantize(weight)))


def _fake_best_times(q8_over_halves: dict[int, float]):
    rows = iter(q8_over_halves)
    return lambda calls: {"halves": 1.0, "q8": q8_over_halves[next(rows)]}


@pytest.mark.parametrize("ratios, chosen", [
    ({1: 0.7, 4: 0.9, 16: 1.1}, True),   # loses a little at 16 rows: one layout, less memory
    ({1: 0.7, 4: 0.9, 16: 1.5}, False),  # loses badly somewhere: the halves
    ({1: 1.3}, False),
])
def test_layers_run_q8_unless_it_loses_some_step_by_more_than_the_margin(monkeypatch, ratios,
                                                                          chosen):
    monkeypatch.setattr(cpu_paths, "_best_times", _fake_best_times(ratios))
    kernel = make_linear(_weight(), None, Placement(torch.device("cpu"), torch.float32,
                                                    TORCH_OPS)).method
    assert cpu_paths.choose_int8_kernel(kernel, kernel, 64, list(ratios))[0] is chosen


def test_engine_builds_no_halves_for_a_tied_q8_0_vocabulary(q8, q8_chosen, tiny_q8_0):
    model = ModelRunner(load_model(tiny_q8_0), EngineConfig(num_kv_blocks=16)).model
    vocabulary = model.lm_head.linear.method
    assert isinstance(vocabulary, CpuQ8Method)
    # The embedding's table is what the vocabulary projection reads and the refinement gathers.
    assert vocabulary.native.operand.q.data_ptr() == model.embed_tokens.weight.q.data_ptr()
    assert model.lm_head.exact.q is model.embed_tokens.weight.q
    assert all(isinstance(linear.method, CpuQ8Method) for linear in model.linears())


def test_engine_through_q8_matches_its_dequantized_self(q8, q8_chosen, tiny_q8_0):
    assert logits_error(tiny_q8_0)[0] < 0.01


def test_engine_greedy_tokens_through_q8_are_the_dequantized_models(q8, q8_chosen, tiny_q8_0):
    assert greedy_tokens(tiny_q8_0, "auto") == greedy_tokens(tiny_q8_0, "none")


def test_engine_without_the_library_runs_grouped_int8_as_int4_halves(monkeypatch, tiny_q8_0):
    monkeypatch.setenv("PAGODA_NATIVE_KERNELS", "0")
    model = ModelRunner(load_model(tiny_q8_0), EngineConfig(num_kv_blocks=16)).model
    assert all(isinstance(linear.method, CpuSplitInt8Method) for linear in model.linears())


def test_no_compiler_means_no_q8(monkeypatch, tmp_path):
    monkeypatch.setenv("PAGODA_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("CC", str(tmp_path / "no-such-cc"))
    monkeypatch.setattr("pagoda.engine.quantization.native_kernels._unavailable", {})
    assert load_q8_context() is None
