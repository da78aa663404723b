# ruff: noqa: F811 (the fixtures imported from test_cpu_q8 are test arguments)
"""Mixture-of-experts layers run in the one-call C decode step as the eager forward runs them,
bit for bit: Qwen3-MoE with a dense layer among its sparse ones, Qwen2-MoE's gated shared
expert, gpt-oss (sinks, q/k/v/o biases, a router bias, expert biases and the clamped SwiGLU,
every other layer windowed); rows that share experts and rows that share none. Experts our
kernel does not read keep the step eager.

The tiny files (tests/engine/tiny_moe_gguf.py) hold Q8_0 matrices and experts, so that every
linear has a C kernel and moe_experts reads the experts in place."""

from __future__ import annotations

import logging

import pytest
import torch
from gguf import GGMLQuantizationType as QType

from pagoda.engine.layers.moe import Router
from pagoda.engine.models import qwen3_moe
from pagoda.engine.quantization.cpu_experts import CpuExpertsMethod
from tests.engine.models.test_native_decode import _counting, _decoding, _engine, _forward
from tests.engine.quantization.test_cpu_q8 import q8, q8_chosen  # noqa: F401 (fixtures)
from tests.engine.tiny_moe_gguf import WINDOW, write_tiny_moe_gguf

# Six rows: past gpt-oss's window of 8 for most, and enough that some share experts.
PROMPTS = [list(range(100, 112)), list(range(200, 205)), list(range(10, 28)),
           list(range(40, 49)), list(range(60, 63)), list(range(150, 170))]
DENSE_LAYERS = (0,)
VARIANTS = {"qwen3moe with a dense layer": ("qwen3moe", DENSE_LAYERS),
            "qwen2moe with a gated shared expert": ("qwen2moe", ()),
            "gpt-oss": ("gpt-oss", ())}


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> dict:
    root = tmp_path_factory.mktemp("tiny-moe")
    return {name: write_tiny_moe_gguf(root / f"{i}.gguf", architecture, dense)
            for i, (name, (architecture, dense)) in enumerate(VARIANTS.items())}


@pytest.fixture
def variant(request, monkeypatch, files):
    """The variant's file, its config as the test wrote it (a dense layer among the sparse)."""
    _, dense = VARIANTS[request.param]
    if dense:
        from_file = qwen3_moe.config_from_gguf

        def with_dense_layers(settings):
            config = from_file(settings)
            config.mlp_only_layers = list(dense)
            return config

        monkeypatch.setattr(qwen3_moe, "config_from_gguf", with_dense_layers)
    return files[request.param]


@pytest.fixture
def routed(monkeypatch) -> list[torch.Tensor]:
    """Every expert id the eager routers pick, call by call."""
    picked: list[torch.Tensor] = []
    route = Router.__call__

    def recording(self, x, ops):
        weights, ids = route(self, x, ops)
        picked.append(ids)
        return weights, ids

    monkeypatch.setattr(Router, "__call__", recording)
    return picked


@pytest.mark.parametrize("variant", list(VARIANTS), indirect=True)
def test_moe_layers_run_in_one_c_call_as_eager_runs_them(q8, q8_chosen, variant, routed):
    engine = _engine(variant, num_kv_blocks=64, max_num_seqs=8)
    model = engine.runner.model
    native = model.native_decode
    assert native is not None
    _decoding(engine, PROMPTS, steps=2)
    for _ in range(4):  # gpt-oss's windowed layers drop keys from the start meanwhile
        inputs = engine.runner.prepare_inputs(engine.scheduler.schedule().scheduled)
        assert not inputs.attn.prefills and inputs.attn.num_decode_tokens == len(PROMPTS)
        calls: list[bool] = []
        fused = _forward(engine, inputs, _counting(native, calls))
        routed.clear()
        eager = _forward(engine, inputs, None)
        assert calls == [True]
        assert torch.equal(fused, eager)
        model.native_decode = native
        engine.step()
    _assert_rows_share_experts_and_some_share_none(routed)


def _assert_rows_share_experts_and_some_share_none(routed: list[torch.Tensor]) -> None:
    """Of the last step's layers: both kinds of rows in one step, so the experts' grouping of
    a step's rows is exercised."""
    chosen = [set(row) for ids in routed for row in ids.tolist()]
    rows = len(PROMPTS)
    pairs = [(a, b) for layer in range(0, len(chosen), rows)
             for i, a in enumerate(chosen[layer:layer + rows])
             for b in chosen[layer + i + 1:layer + rows]]
    assert any(a & b for a, b in pairs) and any(not a & b for a, b in pairs)


@pytest.mark.parametrize("variant", ["qwen3moe with a dense layer"], indirect=True)
def test_the_dense_layer_stays_dense_in_the_c_call(q8, q8_chosen, variant):
    """The file's layer 0 is a dense MLP and layer 1 a sparse one, and both run in the call."""
    engine = _engine(variant)
    layers = engine.runner.model.layers
    assert [type(layer.mlp).__name__ for layer in layers] == ["GatedMLP", "SparseMoE"]
    assert engine.runner.model.native_decode is not None


def test_gpt_oss_windows_every_other_layer_and_has_sinks(q8, q8_chosen, files):
    model = _engine(files["gpt-oss"]).runner.model
    assert [layer.attention.window for layer in model.layers] == [WINDOW, 0]
    assert all(layer.attention.sinks is not None for layer in model.layers)


def test_experts_our_kernel_does_not_read_keep_the_step_eager_and_the_log_says_why(
        q8, q8_chosen, tmp_path, caplog):
    """F16 experts are decoded at load and run grouped through their linear methods."""
    path = write_tiny_moe_gguf(tmp_path / "f16-experts.gguf", "qwen3moe",
                               expert_type=QType.F16)
    with caplog.at_level(logging.INFO, logger="pagoda.engine.models.native_decode"):
        engine = _engine(path)
    assert engine.runner.model.native_decode is None
    assert "experts that moe_experts does not read" in caplog.text


@pytest.mark.parametrize("variant", ["qwen2moe with a gated shared expert"], indirect=True)
def test_a_step_whose_experts_run_moe_tiles_is_not_planned(q8, q8_chosen, variant, monkeypatch):
    """Where the calibration gives a step's rows to moe_tiles (which rounds otherwise than
    moe_forward: here from 3 rows), the call makes no plan for the step, which runs eager."""
    engine = _engine(variant)
    native, caches = engine.runner.model.native_decode, engine.runner.kv_caches
    assert native._make_plan(3, caches) is not None
    monkeypatch.setattr(CpuExpertsMethod, "runs_tiles", lambda self, m, top_k: m >= 3)
    assert native._make_plan(2, caches) is not None
    assert native._make_plan(3, caches) is None
