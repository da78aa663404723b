"""Gemma 2 runs as transformers defines it, from a model folder and from the GGUF llama.cpp's
converter writes of it.

The tiny model (tests/engine/tiny_models.py, "gemma2") windows layers 0 and 2 to 8 keys and
keeps 1 and 3 global, so every test prompt runs past the window; its attention softcap of 5
binds on its scores, so a model that skipped the cap would predict other tokens. The reference
is transformers' eager attention, which applies the cap (its SDPA path cannot).

No Q4_K_M test: the tiny model's replies are mostly byte tokens, and llama-server reports one
top-2 gap per complete UTF-8 piece, not per token, so its near-ties cannot be placed (its f16
tokens equal ours at every position even so).
"""

import dataclasses

import pytest
import torch
import transformers

from pagoda.engine import LLM, SamplingParams
from pagoda.engine.errors import ModelLoadError
from pagoda.engine.loading.gguf import GGUFModelFile
from pagoda.engine.models.gemma2 import architecture, config_from_gguf
from tests.engine.family_parity import (
    FakeGGUFSettings,
    assert_gguf_tokenizer_is_the_folders,
    assert_same_argmax,
    eager_hf_model,
    engine_logits,
    greedy_disagreements_with_llama_cpp,
    hf_logits,
    round_matrices_to_fp16,
)
from tests.engine.llama_cpp_references import llama_cpp_records
from tests.engine.models.test_parity import NUM_THREADS, assert_greedy_parity, parity_prompts

WINDOW = 8  # the tiny model's sliding_window
CAP = 5.0  # its attn_logit_softcapping


pytestmark = pytest.mark.usefixtures("fresh_gguf_metadata_cache")


@pytest.fixture(scope="module")
def folder(llama_cpp_ggufs):
    return llama_cpp_ggufs["gemma2"][0]


@pytest.fixture(scope="module")
def prompts(folder) -> list[list[int]]:
    ids = parity_prompts(transformers.AutoTokenizer.from_pretrained(folder))
    assert min(map(len, ids)) > WINDOW
    return ids


@pytest.fixture(scope="module")
def hf_model(folder):
    return eager_hf_model(folder)


@pytest.fixture(scope="module")
def reference(hf_model, prompts) -> list[torch.Tensor]:
    return hf_logits(hf_model, prompts)


def test_gemma2_folder_predicts_transformers_next_token_at_every_position(
        folder, reference, prompts):
    for i, (ours, theirs) in enumerate(zip(engine_logits(folder, prompts), reference,
                                           strict=True)):
        assert_same_argmax(ours, theirs, f"prompt {i}")
        torch.testing.assert_close(ours, theirs, atol=1e-4, rtol=1e-4)


def test_the_tiny_gemma2s_attention_cap_changes_its_predictions(folder, reference, prompts):
    """Without the cap transformers predicts other tokens: the parity above proves the cap."""
    uncapped = eager_hf_model(folder, attn_logit_softcapping=None)
    changed = sum(int((capped.argmax(-1) != free.argmax(-1)).sum())
                  for capped, free in zip(reference, hf_logits(uncapped, prompts), strict=True))
    assert changed > 0


def test_gemma2_greedy_through_chunked_prefill_and_decoding_past_the_window_matches_transformers(
        folder, hf_model, prompts):
    llm = LLM(str(folder), num_kv_blocks=128, num_threads=NUM_THREADS,
              max_num_batched_tokens=16)
    assert_greedy_parity(llm, hf_model, prompts)


def test_gemma2_architecture_reads_the_caps_scale_and_alternating_windows(folder):
    arch = architecture(transformers.AutoConfig.from_pretrained(folder))
    assert arch.shape.layer_windows == (WINDOW, 0, WINDOW, 0)
    assert (arch.attention_softcap, arch.final_softcap) == (CAP, 8.0)
    assert arch.scale == 32 ** -0.5
    assert (arch.norm_offset, arch.activation, arch.embedding_scale) == (1.0, "gelu_tanh", 8.0)


def test_a_bidirectional_gemma2_embedding_model_is_refused():
    with pytest.raises(ModelLoadError, match="both directions"):
        architecture(transformers.Gemma2Config(use_bidirectional_attention=True))


# The file llama.cpp's converter writes


def test_gemma2_gguf_gives_the_folders_logits_to_fp16_rounding(llama_cpp_ggufs, prompts):
    """The converter stores each norm as 1 + w: read as it is, the model would scale by 2 + w."""
    folder, gguf_file = llama_cpp_ggufs["gemma2"]
    reference = round_matrices_to_fp16(eager_hf_model(folder))
    for ours, theirs in zip(engine_logits(gguf_file, prompts), hf_logits(reference, prompts),
                            strict=True):
        torch.testing.assert_close(ours, theirs, atol=1e-4, rtol=1e-4)


def test_gemma2_gguf_config_runs_the_folders_architecture(llama_cpp_ggufs):
    folder, gguf_file = llama_cpp_ggufs["gemma2"]
    want = architecture(transformers.AutoConfig.from_pretrained(folder))
    got = architecture(config_from_gguf(GGUFModelFile(gguf_file)))
    # The file keeps rms_norm_eps as float32; fp32 math rounds 1e-5 to that same value.
    assert got.shape.rms_norm_eps == pytest.approx(want.shape.rms_norm_eps, rel=1e-7)
    assert dataclasses.replace(got, shape=want.shape) == want
    assert got.shape.layer_windows == want.shape.layer_windows


def test_gemma2_gguf_chat_template_and_tokens_are_the_files(llama_cpp_ggufs, tmp_path):
    folder, gguf_file = llama_cpp_ggufs["gemma2"]
    assert_gguf_tokenizer_is_the_folders(gguf_file, folder, tmp_path)


def test_gemma2_gguf_greedy_tokens_equal_llama_cpps(llama_cpp_ggufs):
    record, = llama_cpp_records("tiny_families.json", family="gemma2", type="f16")
    assert not greedy_disagreements_with_llama_cpp(llama_cpp_ggufs["gemma2"][1], record)


# A gemma2 file's settings as llama.cpp reads them


_GEMMA2_KEYS = {"gemma2.embedding_length": 64, "gemma2.attention.head_count": 4,
                "gemma2.attention.head_count_kv": 2, "gemma2.attention.key_length": 32,
                "gemma2.block_count": 4, "gemma2.feed_forward_length": 128,
                "gemma2.context_length": 4096, "gemma2.attention.sliding_window": 16,
                "gemma2.rope.freq_base": 10000.0, "gemma2.attn_logit_softcapping": 5.0,
                "gemma2.final_logit_softcapping": 8.0}


def _keys(metadata: dict) -> FakeGGUFSettings:
    return FakeGGUFSettings("gemma2", _GEMMA2_KEYS | metadata, {})




def test_a_gemma2_file_without_caps_or_window_takes_llama_cpps_defaults():
    bare = {"gemma2.attention.sliding_window": None, "gemma2.attn_logit_softcapping": None,
            "gemma2.final_logit_softcapping": None}
    arch = architecture(config_from_gguf(_keys(bare)))
    assert arch.shape.layer_windows == (4096, 0, 4096, 0)
    assert (arch.attention_softcap, arch.final_softcap) == (50.0, 30.0)


def test_a_gemma2_file_scales_attention_by_head_dim_but_the_27b_by_hidden_over_heads():
    assert architecture(config_from_gguf(_keys({}))).scale == 32 ** -0.5
    layers_of_27b = {"gemma2.block_count": 46}
    assert architecture(config_from_gguf(_keys(layers_of_27b))).scale == 16 ** -0.5


@pytest.mark.parametrize(("settings", "words"), [
    ({"gemma2.attention.sliding_window_pattern": 4}, "sliding_window_pattern"),
    ({"gemma2.rope.freq_base_swa": 5000.0}, "RoPE base of 5000.0"),
    ({"gemma2.attn_logit_softcapping": -1.0}, "attn_logit_softcapping"),
])
def test_a_gemma2_file_with_settings_pagoda_cannot_read_is_refused_in_words(settings, words):
    with pytest.raises(ModelLoadError, match=words):
        config_from_gguf(_keys(settings))


@pytest.mark.slow  # Triton's interpreter runs its kernels on the CPU: ~10 s on a quiet machine
def test_gemma2_on_the_triton_kernels_gives_the_torch_paths_greedy_tokens(folder, prompts):
    """The capped attention kernels, prefill and decode, in windowed and global layers."""
    def greedy(backend: str) -> list[list[int]]:
        llm = LLM(str(folder), num_kv_blocks=64, num_threads=1, kernel_backend=backend,
                  max_num_batched_tokens=16)
        assert llm.engine.runner.model.ops.name == backend
        replies = llm.generate(prompts[:2], SamplingParams(temperature=0, max_tokens=8,
                                                           ignore_eos=True))
        return [reply.outputs[0].token_ids for reply in replies]

    assert greedy("triton") == greedy("torch")
