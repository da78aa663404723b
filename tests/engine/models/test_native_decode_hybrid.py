# ruff: noqa: F811 (the fixtures imported from test_cpu_q8 are test arguments)
"""The hybrid families' layers run in the one-call C decode step as the eager forward runs
them, bit for bit: Qwen3.5's and Qwen3-Next's Gated DeltaNets (each row's conv window and
delta-rule state, at the row's own slot, advanced in place), gated attention and Qwen3-Next's
experts, LFM2's short convolutions and Granite 4's Mamba-2 layers; over steps with the states
carried, rows of several slots, and a row that joins from a fresh state after its prefill.

The tiny models (tests/engine/tiny_models.py; the Qwens: 6 Gated DeltaNets, 2 gated attention
layers), so that every linear has a C kernel: Qwen3.5's, LFM2's and Granite's folders quantized
to int8 at load; Qwen3-Next's (its shared expert widened to 64, a whole number of Q8_0 blocks) as
llama.cpp's converter writes it in Q8_0, its value heads tiled over the key heads."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoConfig

from pagoda.engine import SamplingParams
from pagoda.engine.config import EngineConfig
from pagoda.engine.llm_engine import LLMEngine
from pagoda.engine.models.native_decode import NativeDecode, not_covered
from pagoda.engine.models.registry import architecture_of
from tests.engine import tiny_models
from tests.engine.llama_cpp_converter import convert_to_gguf, gguf_model_name
from tests.engine.models.test_native_decode import _counting, _decoding, _forward
from tests.engine.quantization.test_cpu_q8 import q8, q8_chosen  # noqa: F401 (fixtures)
from tests.engine.tiny_models import save_tiny_model

PROMPTS = [list(range(100, 143)), list(range(200, 205)), list(range(10, 28))]
GREEDY = SamplingParams(temperature=0, max_tokens=20, ignore_eos=True)


@pytest.fixture(scope="module")
def qwen35(tmp_path_factory):
    return save_tiny_model(tmp_path_factory.mktemp("qwen35-native"), "qwen3.5")


@pytest.fixture(scope="module")
def qwen3_next_q8_0(tmp_path_factory):
    root = tmp_path_factory.mktemp("qwen3-next-native")
    with pytest.MonkeyPatch.context() as patch:
        wider = tiny_models._VARIANTS["qwen3-next"] | {"shared_expert_intermediate_size": 64}
        patch.setitem(tiny_models._VARIANTS, "qwen3-next", wider)
        folder = save_tiny_model(root / "folder", "qwen3-next")
    return convert_to_gguf(folder, root / "tiny-qwen3-next.Q8_0.gguf", outtype="q8_0",
                           name=gguf_model_name("qwen3-next"))


@pytest.fixture(scope="module")
def lfm2(tmp_path_factory):
    return save_tiny_model(tmp_path_factory.mktemp("lfm2-native"), "lfm2")


@pytest.fixture(scope="module")
def granite(tmp_path_factory):
    return save_tiny_model(tmp_path_factory.mktemp("granite-native"), "granite-hybrid")


@pytest.fixture(params=["qwen3.5", "qwen3-next", "lfm2", "granite"])
def hybrid(request) -> tuple:
    """The model's path and the engine settings it loads with."""
    if request.param == "qwen3-next":
        return request.getfixturevalue("qwen3_next_q8_0"), {}
    return request.getfixturevalue(request.param.replace(".", "")), {"quantization": "int8"}


def _engine(model: tuple, **config) -> LLMEngine:
    path, settings = model
    return LLMEngine(str(path), EngineConfig(**{"num_kv_blocks": 32, "num_threads": 1,
                                                **settings, **config}))


def _states(engine: LLMEngine) -> list[torch.Tensor]:
    return [t for states in engine.runner.recurrent_states if states is not None for t in states]


def _fused_and_eager(engine: LLMEngine, inputs, native: NativeDecode):
    """The step's logits and the states after it, through the call and eager, each from the
    states before the step (left as the eager step leaves them)."""
    before = [t.clone() for t in _states(engine)]
    calls: list[bool] = []
    fused = _forward(engine, inputs, _counting(native, calls))
    assert calls == [True]
    fused_states = [t.clone() for t in _states(engine)]
    for state, saved in zip(_states(engine), before, strict=True):
        state.copy_(saved)
    eager = _forward(engine, inputs, None)
    engine.runner.model.native_decode = native
    return (fused, fused_states), (eager, _states(engine))


def _assert_same(fused, eager) -> None:
    (fused_logits, fused_states), (eager_logits, eager_states) = fused, eager
    assert torch.equal(fused_logits, eager_logits)
    assert all(torch.equal(a, b) for a, b in zip(fused_states, eager_states, strict=True))


def test_hybrid_decode_steps_in_one_c_call_give_the_eager_logits_and_states_bit_for_bit(
        q8, q8_chosen, hybrid):
    engine = _engine(hybrid)
    native = engine.runner.model.native_decode
    assert native is not None
    inputs = _decoding(engine, PROMPTS, steps=2)
    for _ in range(4):  # the states carried from step to step
        assert not inputs.attn.prefills and inputs.recurrent.num_decodes == len(PROMPTS)
        assert len(set(inputs.recurrent.decode_slots.tolist())) == len(PROMPTS)
        before = [t.clone() for t in _states(engine)]
        fused, eager = _fused_and_eager(engine, inputs, native)
        _assert_same(fused, eager)
        assert not all(torch.equal(a, b) for a, b in zip(before, _states(engine), strict=True))
        engine.step()
        inputs = engine.runner.prepare_inputs(engine.scheduler.schedule().scheduled)


def test_a_row_joining_from_a_fresh_state_decodes_in_the_c_call_as_eager(q8, q8_chosen, hybrid):
    engine = _engine(hybrid, max_num_seqs=8)
    native = engine.runner.model.native_decode
    _decoding(engine, PROMPTS[:2], steps=3)
    engine.add_request("late", list(range(300, 311)), GREEDY)
    engine.step()  # its prefill, beside the others' decodes: eager
    for _ in range(3):
        inputs = engine.runner.prepare_inputs(engine.scheduler.schedule().scheduled)
        assert inputs.recurrent.num_decodes == 3 and not inputs.recurrent.prefills
        _assert_same(*_fused_and_eager(engine, inputs, native))
        engine.step()


def test_hybrid_greedy_tokens_with_and_without_the_c_call_are_the_same(q8, q8_chosen, hybrid):
    """Requests arrive while others decode, so steps with prefills (eager) and without (the
    call) alternate, each row's states carried through both."""

    def greedy(fused: bool) -> list[list[int]]:
        engine = _engine(hybrid, max_num_batched_tokens=24, max_num_seqs=8)
        calls: list[bool] = []
        model = engine.runner.model
        model.native_decode = _counting(model.native_decode, calls) if fused else None
        tokens: dict[str, list[int]] = {}
        for i, prompt in enumerate(PROMPTS):
            engine.add_request(f"r{i}", prompt, GREEDY)
            for _ in range(3):
                for out in engine.step():
                    tokens[out.request_id] = out.outputs[0].token_ids
        while engine.has_unfinished_requests():
            for out in engine.step():
                tokens[out.request_id] = out.outputs[0].token_ids
        assert any(calls) == fused
        return [tokens[f"r{i}"] for i in range(len(PROMPTS))]

    assert greedy(True) == greedy(False)


def test_a_bfloat16_hybrid_model_runs_layer_by_layer(q8, q8_chosen, qwen35):
    """The call runs fp32 activations only (the layers' bf16 roundings are the eager path's)."""
    engine = _engine((qwen35, {"quantization": "int8"}), dtype=torch.bfloat16)
    assert engine.runner.model.native_decode is None


@pytest.mark.parametrize("variant", ["lfm2", "granite-hybrid", "qwen3.5"])
def test_the_hybrid_families_layers_are_all_ones_the_call_runs(tmp_path, variant):
    folder = save_tiny_model(tmp_path, variant)
    assert not_covered(architecture_of(AutoConfig.from_pretrained(folder))) is None
