# ruff: noqa: F811 (the fixtures imported from test_cpu_q4 and _q8 are test arguments)
"""Decode-only steps run the whole layer stack in one C call (pagoda/engine/models/native_decode.py):
the same logits as the eager forward bit for bit, and eager wherever the call cannot serve."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from pagoda.engine import SamplingParams
from pagoda.engine.config import EngineConfig
from pagoda.engine.llm_engine import LLMEngine
from pagoda.engine.models.native_decode import NativeDecode
from pagoda.engine.quantization.stacked import StackedMethod
from tests.engine.quantization.test_cpu_q4 import q4, q4_chosen, tiny_q4_1  # noqa: F401 (fixtures, as arguments below)
from tests.engine.quantization.test_cpu_q6_k import tiny_q4_k_m  # noqa: F401
from tests.engine.quantization.test_cpu_q8 import q8, q8_chosen, tiny_q8_0  # noqa: F401

PROMPTS = [list(range(100, 143)), list(range(200, 205)), list(range(10, 28))]


def _engine(path, **config) -> LLMEngine:
    return LLMEngine(str(path), EngineConfig(**{"num_kv_blocks": 32, "num_threads": 1, **config}))


def _decoding(engine: LLMEngine, prompts: list[list[int]], steps: int, name: str = "r"):
    """The inputs of the engine's next step, after every prompt's prefill and a few decodes."""
    params = SamplingParams(temperature=0, max_tokens=64, ignore_eos=True)
    for i, prompt in enumerate(prompts):
        engine.add_request(f"{name}{i}", prompt, params)
    for _ in range(steps):
        engine.step()
    return engine.runner.prepare_inputs(engine.scheduler.schedule().scheduled)


def _forward(engine: LLMEngine, inputs, native: NativeDecode | None) -> torch.Tensor:
    model, runner = engine.runner.model, engine.runner
    model.native_decode = native
    with torch.inference_mode():
        return model.forward(inputs.input_ids, inputs.positions, inputs.attn, runner.kv_caches,
                             inputs.logits_indices, runner.recurrent_step(inputs))


def _counting(native: NativeDecode, calls: list[bool]) -> NativeDecode:
    forward_layers = native.forward_layers

    def counted(*args):
        out = forward_layers(*args)
        calls.append(out is not None)
        return out

    native.forward_layers = counted
    return native


@pytest.mark.parametrize("kv_cache_dtype", ["auto", "bfloat16"])
def test_decode_step_in_one_c_call_gives_the_eager_logits_bit_for_bit(
        q4, q4_chosen, tiny_q4_1, kv_cache_dtype):
    engine = _engine(tiny_q4_1, kv_cache_dtype=kv_cache_dtype)
    native = engine.runner.model.native_decode
    assert native is not None
    inputs = _decoding(engine, PROMPTS, steps=6)
    assert len(inputs.attn.decode_groups) > 1 and not inputs.attn.prefills
    calls: list[bool] = []
    fused = _forward(engine, inputs, _counting(native, calls))
    eager = _forward(engine, inputs, None)
    assert calls == [True]
    assert torch.equal(fused, eager)


def test_decode_batches_of_any_width_run_in_one_c_call_on_buffers_they_share(
        q4, q4_chosen, tiny_q4_1):
    """3 rows, then 12 (which grows the buffers every plan points into), then 3 again: each
    in one call, with the eager logits bit for bit."""
    engine = _engine(tiny_q4_1, num_kv_blocks=96, max_num_seqs=16)
    calls: list[bool] = []
    native = _counting(engine.runner.model.native_decode, calls)

    def fused(inputs) -> torch.Tensor:
        calls.clear()
        out = _forward(engine, inputs, native)
        assert calls == [True]
        return out

    narrow = _decoding(engine, PROMPTS, steps=6)
    narrow_eager = _forward(engine, narrow, None)
    assert torch.equal(fused(narrow), narrow_eager)
    more = [list(range(20 * i, 11 + 23 * i)) for i in range(9)]
    wide = _decoding(engine, more, steps=6, name="more")
    assert wide.attn.num_decode_tokens == 12 and not wide.attn.prefills
    assert torch.equal(fused(wide), _forward(engine, wide, None))
    assert torch.equal(fused(narrow), narrow_eager)


def test_grouped_int8_layers_run_in_the_c_layer_stack_through_q8_gemv(
        q8, q8_chosen, tiny_q8_0):
    engine = _engine(tiny_q8_0)
    inputs = _decoding(engine, PROMPTS, steps=4)
    calls: list[bool] = []
    fused = _forward(engine, inputs, _counting(engine.runner.model.native_decode, calls))
    assert calls == [True]
    assert torch.equal(fused, _forward(engine, inputs, None))


@pytest.mark.parametrize("prompts", [PROMPTS[:1], PROMPTS], ids=["one row", "three rows"])
def test_a_qkv_of_q4_k_and_q6_k_parts_runs_in_the_c_layer_stack_as_eager_runs_it(
        q8, q4_chosen, tiny_q4_k_m, prompts):
    engine = _engine(tiny_q4_k_m)
    model = engine.runner.model
    assert all(isinstance(layer.qkv_proj.method, StackedMethod) for layer in model.layers)
    inputs = _decoding(engine, prompts, steps=4)
    calls: list[bool] = []
    fused = _forward(engine, inputs, _counting(model.native_decode, calls))
    assert calls == [True]
    assert torch.equal(fused, _forward(engine, inputs, None))


def test_qkv_biases_are_added_in_the_c_layer_stack_as_eager_adds_them(
        q4, q4_chosen, tiny_q4_1):
    """Qwen2's q, k and v biases: added to this model's layers, which have none."""
    engine = _engine(tiny_q4_1)
    model = engine.runner.model
    torch.manual_seed(0)
    for layer in model.layers:
        layer.qkv_proj.bias = torch.randn(layer.qkv_proj.out_features)
    inputs = _decoding(engine, PROMPTS, steps=4)
    calls: list[bool] = []
    fused = _forward(engine, inputs, _counting(NativeDecode.build(model), calls))
    assert calls == [True]
    assert torch.equal(fused, _forward(engine, inputs, None))


def test_greedy_tokens_with_and_without_the_c_layer_stack_are_the_same(
        q4, q4_chosen, tiny_q4_1):
    params = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)

    def greedy(fused: bool) -> list[list[int]]:
        engine = _engine(tiny_q4_1, max_num_batched_tokens=24)
        calls: list[bool] = []
        model = engine.runner.model
        model.native_decode = _counting(model.native_decode, calls) if fused else None
        for i, prompt in enumerate(PROMPTS):
            engine.add_request(f"r{i}", prompt, params)
        tokens: dict[str, list[int]] = {}
        while engine.has_unfinished_requests():
            for out in engine.step():
                tokens[out.request_id] = out.outputs[0].token_ids
        assert any(calls) == fused
        return [tokens[f"r{i}"] for i in range(len(PROMPTS))]

    assert greedy(True) == greedy(False)


def test_steps_with_a_prefill_stay_eager(q4, q4_chosen, tiny_q4_1):
    engine = _engine(tiny_q4_1)
    native = engine.runner.model.native_decode
    inputs = _decoding(engine, PROMPTS[:1], steps=2)
    engine.add_request("late", PROMPTS[1], SamplingParams(temperature=0, max_tokens=4))
    inputs = engine.runner.prepare_inputs(engine.scheduler.schedule().scheduled)
    assert inputs.attn.prefills and inputs.attn.decode_groups
    calls: list[bool] = []
    _forward(engine, inputs, _counting(native, calls))
    assert calls == [False]


def test_a_layer_on_a_gemm_at_the_steps_size_keeps_it_eager(
        q4, q4_chosen, tiny_q4_1):
    engine = _engine(tiny_q4_1)
    model = engine.runner.model
    inputs = _decoding(engine, PROMPTS[:1], steps=2)
    method = model.layers[1].down_proj.method
    method.policy = dataclasses.replace(method.policy, dequantize_from_rows=1)
    calls: list[bool] = []
    fused = _forward(engine, inputs, _counting(NativeDecode.build(model), calls))
    assert calls == [False]
    assert torch.equal(fused, _forward(engine, inputs, None))


def test_without_our_c_kernels_there_is_no_layer_stack_call(monkeypatch, tiny_q4_1):
    monkeypatch.setenv("PAGODA_NATIVE_KERNELS", "0")
    assert _engine(tiny_q4_1).runner.model.native_decode is None

