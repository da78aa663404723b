# ruff: noqa: F811 (the fixtures imported from test_cpu_q4 and _q8 are test arguments)
"""GGUF Q6_K weights kept at their own width (`Q6KWeight`, 0.82 bytes a weight) and multiplied by
q8_gemv from the file's blocks with int8 activations a scale per 256 values (layers and the
vocabulary alike, as llama.cpp's Q8_K),
widened for GEMM steps, and widened to grouped int8 where q8_gemv does not run; a Q4_K_M-like
file's engine reads them so and answers as its dequantized self."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from dequantized_self import greedy_tokens, logits_error
from gguf import GGMLQuantizationType as QType
from tiny_gguf import random_blocks, write_tiny_gguf

from pagoda.engine.config import EngineConfig
from pagoda.engine.layers.linear import Placement, make_fused_linear, make_linear
from pagoda.engine.loading.loader import load_model
from pagoda.engine.quantization.cpu_int4 import CpuInt4Method
from pagoda.engine.quantization.cpu_paths import CpuPathPolicy
from pagoda.engine.quantization.cpu_q8 import CpuQ8Method, Q8Context
from pagoda.engine.quantization.split_int8 import CpuSplitInt8Method
from pagoda.engine.quantization.stacked import StackedMethod
from pagoda.engine.quantization.tensors import (
    Int4Weight,
    Int8Weight,
    Q6KWeight,
    concat,
    dequantize,
    quantize_int4,
    select_rows,
    widen_blocks,
)
from pagoda.engine.worker.model_runner import ModelRunner
from pagoda.kernels.kernel_ops import TORCH_OPS
from tests.engine.quantization.test_cpu_q4 import q4_chosen  # noqa: F401 (a fixture: our kernels at every step size)
from tests.engine.quantization.test_cpu_q8 import q8  # noqa: F401 (a fixture: q8_gemv's context, where it runs)

Q4_K_M = {"attn_v": QType.Q6_K, "ffn_down": QType.Q6_K, "token_embd": QType.Q6_K}


@pytest.fixture(scope="module")
def tiny_q4_k_m(tmp_path_factory):
    """Q4_K layers with Q6_K v and down projections and a tied Q6_K vocabulary."""
    path = tmp_path_factory.mktemp("tiny-q4-k-m") / "tiny.gguf"
    return write_tiny_gguf(path, matrix_type=QType.Q4_K, mixed=Q4_K_M).path


@pytest.fixture(scope="module")
def tiny_q6_k_down(tmp_path_factory):
    """Q4_K layers with Q6_K down projections and vocabulary. (The random tiny model with Q6_K
    v projections too amplifies any difference: its logits move ~5% from its dequantized
    self's through int8-widened Q6_K and through q8_gemv's alike.)"""
    path = tmp_path_factory.mktemp("tiny-q6-k-down") / "tiny.gguf"
    mixed = {"ffn_down": QType.Q6_K, "token_embd": QType.Q6_K}
    return write_tiny_gguf(path, matrix_type=QType.Q4_K, mixed=mixed).path


def _weight(n: int = 40, k: int = 512, seed: int = 3) -> Q6KWeight:
    blocks = random_blocks(QType.Q6_K, n, k, np.random.default_rng(seed))
    return Q6KWeight(torch.from_numpy(np.ascontiguousarray(blocks)))


def _placement(q8: Q8Context | None) -> Placement:
    return Placement(torch.device("cpu"), torch.float32, TORCH_OPS, CpuPathPolicy(), q8=q8)


def _relative_error(got: torch.Tensor, want: torch.Tensor) -> float:
    return ((got - want).norm() / want.norm()).item()


def test_q6_k_layer_runs_q8_on_the_files_blocks_with_int8_activations_per_super_block(q8):
    weight = _weight()
    method = make_linear(weight, None, _placement(q8)).method
    assert isinstance(method, CpuQ8Method)
    assert method.native.operand.q.data_ptr() == weight.blocks.data_ptr()
    torch.manual_seed(0)
    x = torch.randn(3, 512)
    # int8 a scale per 256 values, as llama.cpp's Q6_K kernel takes them (Q8_K): about a
    # percent, where 16 bits gave 1e-4.
    error = _relative_error(method.apply(x, None), F.linear(x, dequantize(weight)))
    assert 1e-4 < error < 2e-2


def test_q6_k_vocabulary_runs_q8s_int8_pass(q8):
    weight = _weight()
    vocabulary = make_linear(weight, None, _placement(q8), precise_int8=False)
    assert isinstance(vocabulary.method, CpuQ8Method)
    x = torch.randn(3, 512)
    assert _relative_error(vocabulary(x), F.linear(x, dequantize(weight))) < 2e-2


def test_q6_k_layer_widens_its_own_blocks_for_the_steps_given_a_gemm(q8):
    weight = _weight()
    placement = dataclasses.replace(_placement(q8),
                                    cpu_int4_policy=CpuPathPolicy(dequantize_from_rows=4))
    method = make_linear(weight, None, placement).method
    assert method.weight is weight
    x = torch.randn(5, 512)
    torch.testing.assert_close(method.apply(x, None), F.linear(x, dequantize(weight)))


def test_without_q8_a_q6_k_layer_runs_widened_to_grouped_int8():
    weight = _weight()
    method = make_linear(weight, None, _placement(None)).method
    assert isinstance(method, CpuSplitInt8Method)
    x = torch.randn(3, 512)
    assert _relative_error(method.apply(x, None), F.linear(x, dequantize(weight))) < 1e-2


def test_q4_k_and_q6_k_parts_of_one_input_run_their_own_kernels_side_by_side(q8):
    q, v = quantize_int4(torch.randn(48, 512)), _weight(8, 512)
    linear = make_fused_linear([q, v], None, _placement(q8))
    assert isinstance(linear.method, StackedMethod) and linear.out_features == 56
    first, second = linear.method.methods
    x = torch.randn(3, 512)
    y = linear(x)
    assert torch.equal(y[:, :48], first.apply(x, None))
    assert torch.equal(y[:, 48:], second.apply(x, None))
    assert isinstance(make_fused_linear([q, v], None, _placement(None)).method,
                      CpuSplitInt8Method)  # without q8: one widened weight, as before


def test_widened_q6_k_moves_each_value_by_at_most_half_an_int8_step():
    weight = _weight()
    widened = widen_blocks(weight)
    assert isinstance(widened, Int8Weight) and widened.group_size == 32
    half_step = widened.scales.repeat_interleave(32, dim=1) / 2
    assert ((dequantize(widened) - dequantize(weight)).abs() <= half_step * 1.001).all()


def test_q6_k_parts_stack_as_q6_k_and_beside_other_layouts_as_grouped_int8():
    a, b = _weight(8, 256, seed=1), _weight(4, 256, seed=2)
    stacked = concat([a, b])
    assert isinstance(stacked, Q6KWeight)
    assert torch.equal(dequantize(stacked), torch.cat([dequantize(a), dequantize(b)]))
    q4 = quantize_int4(torch.randn(8, 256))
    mixed = concat([q4, b])
    assert isinstance(mixed, Int8Weight) and mixed.shape == (12, 256)
    assert torch.equal(dequantize(mixed)[:8], dequantize(q4))
    assert torch.equal(dequantize(select_rows(stacked, torch.tensor([9, 0]))),
                       dequantize(stacked)[[9, 0]])
    assert isinstance(q4, Int4Weight)


def test_q4_k_m_engine_reads_q6_k_layers_and_vocabulary_from_the_files_blocks(
        q8, q4_chosen, tiny_q4_k_m):
    model = ModelRunner(load_model(tiny_q4_k_m), EngineConfig(num_kv_blocks=16)).model
    downs = [layer.down_proj.method for layer in model.layers]
    assert all(isinstance(m, CpuQ8Method) and isinstance(m.weight, Q6KWeight) for m in downs)
    vocabulary = model.lm_head.linear.method
    table = model.embed_tokens.weight
    assert isinstance(table, Q6KWeight)
    qkv = [layer.qkv_proj.method for layer in model.layers]
    assert all(isinstance(m, StackedMethod) for m in qkv)
    assert [type(p) for p in qkv[0].methods] == [CpuInt4Method, CpuQ8Method]
    # One copy of the table: the embedding gathers, the projection and the refinement read it.
    assert vocabulary.native.operand.q.data_ptr() == table.blocks.data_ptr()
    assert model.lm_head.exact is table


def test_q6_k_engine_logits_are_its_dequantized_selfs_to_a_percent(q8, q4_chosen,
                                                                   tiny_q6_k_down):
    assert logits_error(tiny_q6_k_down)[0] < 0.01


def test_q6_k_engine_greedy_tokens_are_its_dequantized_selfs(q8, q4_chosen, tiny_q6_k_down):
    assert greedy_tokens(tiny_q6_k_down, "auto") == greedy_tokens(tiny_q6_k_down, "none")
