"""Gemma 3 (text) runs as transformers defines it, from a model folder and from the GGUF
llama.cpp's converter writes of it.

The tiny model (tests/engine/tiny_models.py, "gemma3") windows layers 0-4 to 8 keys and keeps
layer 5 global, each kind with its own RoPE base, so every test prompt runs past the window;
"gemma3-query-scalar" scales attention by a query_pre_attn_scalar other than head_dim (as the
27B does), which llama.cpp's files do not keep, so it is tested from a folder only.
"""

import json
import re
import shutil
from pathlib import Path

import pytest
import torch
import transformers
from safetensors.torch import load_file, save_file
from tiny_models import save_tiny_model

from pagoda.engine import LLM
from pagoda.engine.config import EngineConfig
from pagoda.engine.errors import ModelLoadError
from pagoda.engine.loading.gguf import GGUFModelFile
from pagoda.engine.loading.loader import load_model
from pagoda.engine.models.gemma3 import architecture, config_from_gguf
from pagoda.engine.models.registry import architecture_of
from pagoda.engine.worker.model_runner import ModelRunner
from tests.engine.family_parity import (
    LLAMA_CPP_QUANTIZED_NEAR_TIE,
    assert_gguf_tokenizer_is_the_folders,
    assert_same_argmax,
    engine_logits,
    greedy_disagreements_with_llama_cpp,
    hf_logits,
    round_matrices_to_fp16,
)
from tests.engine.hf_reference import load_hf_model
from tests.engine.llama_cpp_converter import quantize_with_llama_cpp
from tests.engine.llama_cpp_references import llama_cpp_records
from tests.engine.models.test_parity import NUM_THREADS, assert_greedy_parity, parity_prompts
from tests.engine.test_triton_engine import greedy as triton_greedy

pytestmark = pytest.mark.usefixtures("fresh_gguf_metadata_cache")

WINDOW = 8  # the tiny model's sliding_window


@pytest.fixture(scope="module")
def folders(llama_cpp_ggufs, tmp_path_factory) -> dict:
    """{variant: its HF folder} for "gemma3" (the one llama.cpp's converter wrote a file of)
    and "gemma3-query-scalar"."""
    return {"gemma3": llama_cpp_ggufs["gemma3"][0],
            "gemma3-query-scalar": save_tiny_model(tmp_path_factory.mktemp("query-scalar"),
                                                   "gemma3-query-scalar")}


@pytest.fixture(scope="module")
def prompts(folders) -> list[list[int]]:
    ids = parity_prompts(transformers.AutoTokenizer.from_pretrained(folders["gemma3"]))
    assert min(map(len, ids)) > WINDOW
    return ids


@pytest.fixture(scope="module")
def hf_model(folders):
    return load_hf_model(folders["gemma3"])


@pytest.mark.parametrize("variant", ["gemma3", "gemma3-query-scalar"])
def test_gemma3_folder_predicts_transformers_next_token_at_every_position(
        variant, folders, prompts):
    for i, (ours, theirs) in enumerate(zip(engine_logits(folders[variant], prompts),
                                           hf_logits(load_hf_model(folders[variant]), prompts),
                                           strict=True)):
        assert_same_argmax(ours, theirs, f"{variant} prompt {i}")
        torch.testing.assert_close(ours, theirs, atol=1e-4, rtol=1e-4)


def test_gemma3_greedy_through_chunked_prefill_and_decoding_past_the_window_matches_transformers(
        folders, hf_model, prompts):
    llm = LLM(str(folders["gemma3"]), num_kv_blocks=128, num_threads=NUM_THREADS,
              max_num_batched_tokens=16)
    assert_greedy_parity(llm, hf_model, prompts)


@pytest.fixture(scope="module")
def two_layer_folder(folders, tmp_path_factory) -> Path:
    """The tiny model cut to its layer 4 (windowed) and layer 5 (global): Triton's interpreter
    runs each kernel launch in Python, so every layer costs seconds."""
    folder = tmp_path_factory.mktemp("gemma3-two-layers")
    for file in folders["gemma3"].iterdir():
        if file.name != "model.safetensors":
            shutil.copy(file, folder)
    config = json.loads((folder / "config.json").read_text())
    config |= {"num_hidden_layers": 2, "layer_types": config["layer_types"][-2:]}
    (folder / "config.json").write_text(json.dumps(config))
    tensors = load_file(folders["gemma3"] / "model.safetensors")
    renamed = {re.sub(r"layers\.([45])\.", lambda m: f"layers.{int(m[1]) - 4}.", name): tensor
               for name, tensor in tensors.items() if not re.search(r"layers\.[0-3]\.", name)}
    save_file(renamed, folder / "model.safetensors", metadata={"format": "pt"})
    return folder


@pytest.mark.slow  # Triton's interpreter runs its kernels on the CPU: ~10 s on a quiet machine
def test_gemma3_on_the_triton_kernels_gives_the_torch_paths_greedy_tokens(two_layer_folder):
    """GeGLU, the per-head q/k norms and the sandwich norms on Triton, two rotary tables, and
    attention windowed in one layer (the prompts run past 8 tokens) but not in the other."""
    assert triton_greedy(two_layer_folder, "triton") == triton_greedy(two_layer_folder, "torch")


def test_gemma3_gguf_gives_the_folders_logits_to_fp16_rounding(llama_cpp_ggufs, prompts):
    folder, gguf_file = llama_cpp_ggufs["gemma3"]
    reference = round_matrices_to_fp16(load_hf_model(folder))
    for ours, theirs in zip(engine_logits(gguf_file, prompts), hf_logits(reference, prompts),
                            strict=True):
        torch.testing.assert_close(ours, theirs, atol=1e-4, rtol=1e-4)


def test_gemma3_gguf_norms_reach_the_model_as_the_folders_do_to_the_bit(llama_cpp_ggufs):
    """The converter stores 1 + w; the model scales by 1 + w: from either source it must hold
    the same numbers, not 2 + w from the file."""
    folder, gguf_file = llama_cpp_ggufs["gemma3"]
    config = EngineConfig(num_kv_blocks=8, num_threads=1)
    from_folder = ModelRunner(load_model(folder), config).model
    from_file = ModelRunner(load_model(gguf_file, quantization="none"), config).model

    assert torch.equal(from_file.norm, from_folder.norm)
    for ours, theirs in zip(from_file.layers, from_folder.layers, strict=True):
        for norm in (lambda layer: layer.input_norm, lambda layer: layer.attention_out_norm,
                     lambda layer: layer.mlp_norm, lambda layer: layer.mlp_out_norm,
                     lambda layer: layer.attention.q_norm, lambda layer: layer.attention.k_norm):
            assert torch.equal(norm(ours), norm(theirs))


def test_gemma3_gguf_config_runs_the_folders_architecture(llama_cpp_ggufs):
    folder, gguf_file = llama_cpp_ggufs["gemma3"]
    want = architecture_of(transformers.AutoConfig.from_pretrained(folder))
    got = architecture(config_from_gguf(GGUFModelFile(gguf_file)))

    # The file keeps rms_norm_eps as float32; fp32 math rounds 1e-5 to that same value.
    assert got.shape.rms_norm_eps == pytest.approx(want.shape.rms_norm_eps, rel=1e-7)
    assert got.shape.layer_windows == (WINDOW,) * 5 + (0,)
    for field in ("layers", "ropes", "names", "attention_scale", "norm_offset", "activation",
                  "embedding_scale", "final_softcap", "tied_embeddings"):
        assert getattr(got, field) == getattr(want, field), field


def test_gemma3_gguf_chat_template_and_tokens_are_the_files(llama_cpp_ggufs, tmp_path):
    folder, gguf_file = llama_cpp_ggufs["gemma3"]
    assert_gguf_tokenizer_is_the_folders(gguf_file, folder, tmp_path)


def test_gemma3_gguf_greedy_tokens_equal_llama_cpps(llama_cpp_ggufs):
    record, = llama_cpp_records("tiny_families.json", family="gemma3", type="f16")
    assert not greedy_disagreements_with_llama_cpp(llama_cpp_ggufs["gemma3"][1], record)


def test_gemma3_q4_k_m_greedy_tokens_equal_llama_cpps(llama_cpp_ggufs, tmp_path):
    """llama-quantize's Q4_K_M of the tiny model, which we read exactly; llama.cpp also rounds
    activations to 8 bits, so its ties are wider."""
    q4 = quantize_with_llama_cpp(llama_cpp_ggufs["gemma3"][1], tmp_path / "tiny-gemma3.Q4_K_M.gguf")
    record, = llama_cpp_records("tiny_families.json", family="gemma3", type="Q4_K_M")
    assert not greedy_disagreements_with_llama_cpp(q4, record, LLAMA_CPP_QUANTIZED_NEAR_TIE)


# A gemma3 file's settings as llama.cpp reads them


class _Settings:
    """A gemma3 file's keys, without a file."""

    architecture = "gemma3"

    def __init__(self, metadata: dict):
        self._metadata = _GEMMA3_KEYS | metadata

    def metadata(self, key: str) -> object:
        return self._metadata.get(key)

    def tensor_dims(self, name: str) -> tuple[int, ...] | None:
        return {"token_embd.weight": (100, 64)}.get(name)

    def small_vector(self, name: str, length: int) -> list[float] | None:
        return None


_GEMMA3_KEYS = {"gemma3.embedding_length": 64, "gemma3.attention.head_count": 4,
                "gemma3.attention.head_count_kv": 1, "gemma3.attention.key_length": 32,
                "gemma3.block_count": 8, "gemma3.feed_forward_length": 128,
                "gemma3.context_length": 4096, "gemma3.attention.sliding_window": 16,
                "gemma3.rope.freq_base": 1e6}


def kinds(settings: dict) -> list[tuple[int, str]]:
    return [(kind.window, kind.rope)
            for kind in architecture(config_from_gguf(_Settings(settings))).layers]


def test_a_gemma3_file_without_a_pattern_windows_five_layers_of_six_as_llama_cpp_does():
    assert kinds({}) == ([(16, "sliding_attention")] * 5 + [(0, "full_attention")]
                         + [(16, "sliding_attention")] * 2)


def test_a_gemma3_file_pattern_of_flags_or_period_sets_the_windowed_layers():
    flags = [True, False] * 4
    assert [window for window, _ in kinds({"gemma3.attention.sliding_window_pattern": flags})] \
        == [16, 0] * 4
    assert [window for window, _ in kinds({"gemma3.attention.sliding_window_pattern": 4})] \
        == [16, 16, 16, 0] * 2
    assert [window for window, _ in kinds({"gemma3.attention.sliding_window_pattern": 0})] \
        == [16] * 8


def test_a_gemma3_file_without_a_window_runs_every_layer_global():
    assert kinds({"gemma3.attention.sliding_window": 0}) == [(0, "full_attention")] * 8


def test_a_gemma3_file_rope_bases_and_linear_scaling_reach_their_layer_kinds():
    config = config_from_gguf(_Settings({"gemma3.rope.freq_base_swa": 5000.0,
                                         "gemma3.rope.scaling.type": "linear",
                                         "gemma3.rope.scaling.factor": 8.0}))
    ropes = {kind: dict(spec.parameters) for kind, spec in architecture(config).ropes.items()}
    assert ropes == {"sliding_attention": {"rope_type": "default", "rope_theta": 5000.0},
                     "full_attention": {"rope_type": "linear", "rope_theta": 1e6, "factor": 8.0}}
    default = config_from_gguf(_Settings({}))
    assert default.rope_parameters["sliding_attention"]["rope_theta"] == 10000.0  # llama.cpp's


def test_a_gemma3_file_scales_attention_by_head_dim_but_the_27b_by_hidden_over_heads():
    assert architecture(config_from_gguf(_Settings({}))).scale == 32 ** -0.5
    layers_of_27b = {"gemma3.block_count": 62}
    assert architecture(config_from_gguf(_Settings(layers_of_27b))).scale == 16 ** -0.5


def test_a_gemma3_file_final_softcap_is_read_or_absent():
    assert config_from_gguf(_Settings({})).final_logit_softcapping is None
    capped = _Settings({"gemma3.final_logit_softcapping": 30.0})
    assert architecture(config_from_gguf(capped)).final_softcap == 30.0


@pytest.mark.parametrize(("settings", "words"), [
    ({"gemma3.attention.sliding_window_pattern": [True, False]}, "names 2 layers for a model of 8"),
    ({"gemma3.attention.sliding_window_pattern": -1}, "sliding_window_pattern"),
    ({"gemma3.rope.scaling.type": "longrope"}, "'longrope'"),
])
def test_a_gemma3_file_with_settings_pagoda_cannot_read_is_refused_in_words(settings, words):
    with pytest.raises(ModelLoadError, match=words):
        config_from_gguf(_Settings(settings))


# What Pagoda does not run, said in words


def test_a_gemma3_config_with_attention_logit_softcapping_is_refused():
    config = transformers.Gemma3TextConfig(attn_logit_softcapping=50.0)
    with pytest.raises(ModelLoadError, match="attn_logit_softcapping"):
        architecture(config)


def test_a_bidirectional_gemma3_embedding_model_is_refused():
    config = transformers.Gemma3TextConfig(use_bidirectional_attention=True)
    with pytest.raises(ModelLoadError, match="both directions"):
        architecture(config)


def test_a_multimodal_gemma4_folder_is_refused_with_the_reason(tmp_path):
    """(A multimodal Gemma 3 runs: tests/engine/multimodal/test_gemma3_images.py.)"""
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "gemma4"}))
    with pytest.raises(ModelLoadError, match="vision-language model: not yet"):
        load_model(tmp_path)
