# ruff: noqa: F811 (the fixtures imported from test_cpu_q4 are test arguments)
"""The one-call C decode step runs the layers of every family as the eager forward runs them, bit
for bit: a window per layer, two rotary tables (Gemma 3), no RoPE on a layer (SmolLM3), partial
rotary (Phi-4), per-head q/k norms (Qwen3, Gemma 3), sandwich norms and GeGLU (Gemma 3).

The tiny Qwen3 GGUF (Q4_1 layers, so every linear has a C kernel) is loaded with its
architecture changed to each layout; its norm weights fill the roles a Qwen3 lacks."""

from __future__ import annotations

import dataclasses
import logging

import pytest
import torch

from pagoda.engine.layers.rotary import RopeSpec
from pagoda.engine.models import llama
from pagoda.engine.models.architecture import AttentionKind, DecoderArchitecture
from tests.engine.models.test_native_decode import PROMPTS, _counting, _decoding, _engine, _forward
from tests.engine.quantization.test_cpu_q4 import q4, q4_chosen  # noqa: F401 (fixtures)
from tests.engine.tiny_gguf import write_tiny_gguf

WINDOW = 8  # shorter than two of the three prompts: the windowed layer drops keys from the start


@pytest.fixture(scope="module")
def tiny_qwen3(tmp_path_factory):
    from gguf import GGMLQuantizationType as QType

    path = tmp_path_factory.mktemp("tiny-qwen3") / "tiny.gguf"
    return write_tiny_gguf(path, architecture="qwen3", matrix_type=QType.Q4_1).path


def _with_theta(spec: RopeSpec, theta: float) -> RopeSpec:
    params = dict(spec.parameters) | {"rope_theta": theta}
    return dataclasses.replace(spec, parameters=tuple(sorted(params.items())))


def _gemma3_layout(arch: DecoderArchitecture) -> DecoderArchitecture:
    """Layer 0 windowed with a local table (base 1,000), layer 1 global (base 1,000,000); norms
    after the attention and the MLP; GeGLU."""
    spec = arch.ropes["default"]
    return dataclasses.replace(
        arch, shape=dataclasses.replace(arch.shape, layer_windows=(WINDOW, 0)),
        layers=(AttentionKind(WINDOW, "local"), AttentionKind(0, "global")),
        ropes={"local": _with_theta(spec, 1000.0), "global": _with_theta(spec, 1e6)},
        names=dataclasses.replace(arch.names, attention_out_norm="post_attention_layernorm",
                                  mlp_out_norm="input_layernorm"),
        activation="gelu_tanh", embedding_scale=16.0)


def _nope_layout(arch: DecoderArchitecture) -> DecoderArchitecture:
    return dataclasses.replace(arch, layers=(AttentionKind(0, "default"), AttentionKind(0, None)))


def _partial_rotary_layout(arch: DecoderArchitecture) -> DecoderArchitecture:
    spec = arch.ropes["default"]
    return dataclasses.replace(arch, ropes={"default": dataclasses.replace(
        spec, rotary_dim=spec.rotary_dim * 3 // 4)})


def _windowed_first_layout(arch: DecoderArchitecture) -> DecoderArchitecture:
    """Qwen3 with layer_types [sliding, full]: one rotary table, two windows."""
    return dataclasses.replace(
        arch, shape=dataclasses.replace(arch.shape, layer_windows=(WINDOW, 0)),
        layers=(AttentionKind(WINDOW), AttentionKind(0)))


LAYOUTS = {"qwen3": lambda arch: arch, "gemma3": _gemma3_layout, "nope": _nope_layout,
           "partial-rotary": _partial_rotary_layout, "windowed-first": _windowed_first_layout}


@pytest.fixture
def layout(request, monkeypatch):
    """The tiny Qwen3's architecture as loaded, changed by the test's LAYOUTS entry."""
    change = LAYOUTS[request.param]
    loaded = llama.architecture
    monkeypatch.setattr(llama, "architecture", lambda config: change(loaded(config)))
    return request.param


def _assert_fused_steps_are_eager(engine, steps: int) -> None:
    """For each of `steps` decode steps: the one call's logits are the eager ones, bit for bit."""
    native = engine.runner.model.native_decode
    assert native is not None
    for _ in range(steps):
        inputs = engine.runner.prepare_inputs(engine.scheduler.schedule().scheduled)
        assert not inputs.attn.prefills
        calls: list[bool] = []
        fused = _forward(engine, inputs, _counting(native, calls))
        eager = _forward(engine, inputs, None)
        assert calls == [True]
        assert torch.equal(fused, eager)
        engine.runner.model.native_decode = native
        engine.step()


@pytest.mark.parametrize("layout", list(LAYOUTS), indirect=True)
def test_each_familys_layers_run_in_one_c_call_as_eager_runs_them(
        q4, q4_chosen, tiny_qwen3, layout):
    engine = _engine(tiny_qwen3)
    _decoding(engine, PROMPTS, steps=2)
    _assert_fused_steps_are_eager(engine, steps=3)


@pytest.mark.parametrize("layout", ["gemma3"], indirect=True)
def test_a_windowed_layer_past_its_window_into_a_bf16_cache_is_eagers_too(
        q4, q4_chosen, tiny_qwen3, layout):
    """The 5-token prompt crosses the 8-token window during these steps; one row alone, too."""
    engine = _engine(tiny_qwen3, kv_cache_dtype="bfloat16")
    _decoding(engine, PROMPTS[1:2], steps=2)
    _assert_fused_steps_are_eager(engine, steps=4)


@pytest.mark.parametrize("layout", ["gemma3"], indirect=True)
def test_the_windowed_layer_reads_its_own_windows_metadata(q4, q4_chosen, tiny_qwen3, layout):
    """A step's windowed layer attends through the metadata the runner made for its window:
    clipping that one's context lengths changes the result, the global one's does not."""
    engine = _engine(tiny_qwen3)
    inputs = _decoding(engine, PROMPTS, steps=2)
    native = engine.runner.model.native_decode
    meta = inputs.attn
    assert meta.sliding_window == 0 and WINDOW in meta.windowed
    before = _forward(engine, inputs, native)
    windowed = meta.windowed[WINDOW]
    for group in windowed.decode_groups:
        group.context_lens = group.context_lens.clone()
        group.context_lens[0] -= 1  # one key fewer, for the windowed layer only
    assert not torch.equal(_forward(engine, inputs, native), before)


@pytest.mark.parametrize("layout", ["qwen3"], indirect=True)
def test_attention_logit_softcapping_stays_eager_and_the_load_log_says_why(
        q4, q4_chosen, tiny_qwen3, layout, monkeypatch, caplog):
    capped = llama.architecture
    monkeypatch.setattr(llama, "architecture",
                        lambda config: dataclasses.replace(capped(config), attention_softcap=50.0))
    with caplog.at_level(logging.INFO, logger="pagoda.engine.models.decoder"):
        engine = _engine(tiny_qwen3)
    assert engine.runner.model.native_decode is None
    assert "does not run attention logit softcapping" in caplog.text



def test_the_tiny_gemma3_decodes_in_one_c_call_as_eager_does(q4, q4_chosen, llama_cpp_ggufs):
    """The Gemma 3 family module's own architecture (five windowed layers of 8 tokens and a
    global one, two rotary tables, q/k and sandwich norms, GeGLU, scaled embeddings, the final
    softcap), its weights quantized to int4 at load so that every linear has a C kernel."""
    folder, _gguf = llama_cpp_ggufs["gemma3"]
    engine = _engine(folder, quantization="int4", num_kv_blocks=64)
    assert engine.runner.model.arch.family == "Gemma 3"
    _decoding(engine, PROMPTS, steps=2)
    _assert_fused_steps_are_eager(engine, steps=3)
