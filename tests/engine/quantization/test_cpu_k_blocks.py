# ruff: noqa: F811 (the fixtures imported from test_cpu_q4 and _q8 are test arguments)
"""GGUF IQ4_XS, Q5_K and Q3_K weights kept at their own width (`IQ4XSWeight`, 0.53 bytes a
weight; `Q5KWeight`, 0.69; `Q3KWeight`, 0.43) and multiplied by q8_gemv from the file's blocks; widened to grouped int8
exactly where q8_gemv does not run and for the steps given a GEMM; a file of them loads so,
says nothing of widening, is counted at its own bytes, and answers as its dequantized self."""

from __future__ import annotations

import logging

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
from pagoda.engine.loading.model_info import describe_model
from pagoda.engine.quantization import cpu_paths
from pagoda.engine.quantization.cpu_paths import CpuPathPolicy
from pagoda.engine.quantization.cpu_q8 import CpuQ8Method, Q8Context
from pagoda.engine.quantization.split_int8 import CpuSplitInt8Method
from pagoda.engine.quantization.stacked import StackedMethod
from pagoda.engine.quantization.tensors import (
    BlockWeight,
    Int8Weight,
    IQ4XSWeight,
    Q3KWeight,
    Q5KWeight,
    concat,
    dequantize,
    widen_blocks,
)
from pagoda.engine.worker.model_runner import ModelRunner
from pagoda.kernels.kernel_ops import TORCH_OPS
from tests.engine.quantization.test_cpu_q4 import q4_chosen  # noqa: F401 (a fixture: our kernels at every step size)
from tests.engine.quantization.test_cpu_q8 import q8  # noqa: F401 (a fixture: q8_gemv's context, where it runs)

KINDS = pytest.mark.parametrize("kind", [IQ4XSWeight, Q5KWeight, Q3KWeight],
                                ids=["IQ4_XS", "Q5_K", "Q3_K"])
# An IQ4_XS file as llama-quantize makes one keeps some layers at other types: Q5_K and Q3_K
# here.
MIX = {"ffn_down": QType.Q5_K, "attn_v": QType.Q5_K, "attn_output": QType.Q3_K}


@pytest.fixture(scope="module")
def tiny_iq4_xs(tmp_path_factory):
    path = tmp_path_factory.mktemp("tiny-iq4-xs") / "tiny.gguf"
    return write_tiny_gguf(path, matrix_type=QType.IQ4_XS, mixed=MIX).path


def _weight(kind: type[BlockWeight], n: int = 40, k: int = 512, seed: int = 3) -> BlockWeight:
    blocks = random_blocks(QType[kind.TYPE_NAME], n, k, np.random.default_rng(seed))
    return kind(torch.from_numpy(np.ascontiguousarray(blocks)))


def _placement(q8: Q8Context | None, **policy) -> Placement:
    return Placement(torch.device("cpu"), torch.float32, TORCH_OPS, CpuPathPolicy(**policy),
                     q8=q8)


def _relative_error(got: torch.Tensor, want: torch.Tensor) -> float:
    return ((got - want).norm() / want.norm()).item()


# A layer's activations: Q3_K's to 16 bits; IQ4_XS's and Q5_K's to int8 a scale per 256
# values, as llama.cpp's kernels for them take them (Q8_K): to a few percent on random rows.
LAYER_ERROR = {IQ4XSWeight: 3e-2, Q5KWeight: 3e-2, Q3KWeight: 1e-4}


@KINDS
def test_layer_runs_q8_on_the_files_blocks(q8, kind):
    weight = _weight(kind)
    method = make_linear(weight, None, _placement(q8)).method
    assert isinstance(method, CpuQ8Method)
    assert method.native.operand.q.data_ptr() == weight.blocks.data_ptr()
    torch.manual_seed(0)
    for rows in (1, 2, 3, 4):
        x = torch.randn(rows, 512)
        error = _relative_error(method.apply(x, None), F.linear(x, dequantize(weight)))
        assert error < LAYER_ERROR[kind]


@KINDS
def test_vocabulary_runs_q8s_int8_pass(q8, kind):
    weight = _weight(kind)
    vocabulary = make_linear(weight, None, _placement(q8), precise_int8=False)
    assert isinstance(vocabulary.method, CpuQ8Method)
    torch.manual_seed(1)
    x = torch.randn(3, 512)
    assert _relative_error(vocabulary(x), F.linear(x, dequantize(weight))) < 3e-2


@KINDS
def test_steps_given_a_gemm_widen_the_same_blocks(q8, kind):
    weight = _weight(kind)
    method = make_linear(weight, None, _placement(q8, dequantize_from_rows=4)).method
    assert method.weight is weight
    x = torch.randn(5, 512)
    torch.testing.assert_close(method.apply(x, None), F.linear(x, dequantize(weight)))


@KINDS
def test_without_q8_a_layer_runs_widened_to_grouped_int8_exactly(kind):
    weight = _weight(kind)
    widened = widen_blocks(weight)
    assert isinstance(widened, Int8Weight) and widened.group_size == 32
    assert torch.equal(dequantize(widened), dequantize(weight))
    assert isinstance(make_linear(weight, None, _placement(None)).method, CpuSplitInt8Method)


def test_parts_stack_by_type_and_run_side_by_side_where_types_differ(q8):
    a, b = _weight(IQ4XSWeight, 8, 256, seed=1), _weight(IQ4XSWeight, 4, 256, seed=2)
    stacked = concat([a, b])
    assert isinstance(stacked, IQ4XSWeight)
    assert torch.equal(dequantize(stacked), torch.cat([dequantize(a), dequantize(b)]))
    v = _weight(Q5KWeight, 4, 256, seed=3)
    linear = make_fused_linear([a, b, v], None, _placement(q8))
    assert isinstance(linear.method, StackedMethod)
    assert [type(m.weight) for m in linear.method.methods] == [IQ4XSWeight, Q5KWeight]
    torch.manual_seed(2)
    x = torch.randn(2, 256)
    want = F.linear(x, torch.cat([dequantize(a), dequantize(b), dequantize(v)]))
    assert _relative_error(linear(x), want) < LAYER_ERROR[IQ4XSWeight]


def test_iq4_xs_file_keeps_its_blocks_and_never_says_widened(q8, q4_chosen, tiny_iq4_xs,
                                                             caplog):
    with caplog.at_level(logging.INFO):
        model = ModelRunner(load_model(tiny_iq4_xs), EngineConfig(num_kv_blocks=16)).model
    assert not any("widened" in record.getMessage() for record in caplog.records)
    layer = model.layers[0]
    assert isinstance(layer.down_proj.method, CpuQ8Method)
    assert isinstance(layer.down_proj.method.weight, Q5KWeight)
    assert isinstance(layer.gate_up_proj.method.weight, IQ4XSWeight)


def test_memory_estimate_counts_the_files_own_bytes(tiny_iq4_xs, tmp_path):
    q8_0 = write_tiny_gguf(tmp_path / "tiny.Q8_0.gguf", matrix_type=QType.Q8_0).path
    assert describe_model(tiny_iq4_xs).weight_bytes < 0.6 * describe_model(q8_0).weight_bytes


def test_iq4_xs_engine_logits_are_its_dequantized_selfs_to_a_few_percent(q8, q4_chosen,
                                                                         tiny_iq4_xs):
    # Each layer's int8 activations (LAYER_ERROR) add up over the tiny model's layers.
    assert logits_error(tiny_iq4_xs)[0] < 0.05


def test_iq4_xs_engine_greedy_tokens_are_its_dequantized_selfs(q8, q4_chosen, tiny_iq4_xs):
    assert greedy_tokens(tiny_iq4_xs, "auto") == greedy_tokens(tiny_iq4_xs, "none")




@pytest.mark.parametrize("kernel_over_gemm, threshold", [
    ({16: 0.2, 64: 1.3, 256: 3.0}, 64),     # the GEMM wins for good from 64 rows
    ({16: 0.2, 64: 1.1, 256: 3.0}, 256),    # by less than the margin at 64: from 256
    ({16: 0.2, 64: 2.0, 256: 0.9}, None),   # the kernel takes the largest steps back: never
])
def test_blocks_widen_for_a_gemm_from_where_their_own_kernel_loses_for_good(
        monkeypatch, kernel_over_gemm, threshold):
    rows = iter(kernel_over_gemm)
    monkeypatch.setattr(cpu_paths, "_best_times",
                        lambda calls: {"kernel": kernel_over_gemm[next(rows)], "gemm": 1.0})
    method = make_linear(_weight(IQ4XSWeight), None, _placement(None, dequantize_from_rows=1))
    chosen = cpu_paths.choose_blocks_gemm_rows(method.method, 512, [1, 4, *kernel_over_gemm],
                                               torch.float32)[0]
    assert chosen == threshold


def test_an_engine_on_a_file_of_blocks_times_their_own_gemm_step(q8, q4_chosen, tiny_iq4_xs,
                                                                monkeypatch):
    monkeypatch.setattr(cpu_paths, "choose_blocks_gemm_rows", lambda *args: (64, "chosen"))
    model = ModelRunner(load_model(tiny_iq4_xs), EngineConfig(num_kv_blocks=16)).model
    layer = model.layers[0]
    assert layer.gate_up_proj.method.policy.dequantize_from_rows == 64
    assert layer.down_proj.method.policy.dequantize_from_rows == 64
