# ruff: noqa: F811 (the fixtures imported from test_cpu_q4 are test arguments)
"""SmolLM3 (Llama layers, every fourth without RoPE) runs as transformers defines it, from a model
folder and from the GGUF llama.cpp's converter writes of it.

The tiny model (tests/engine/tiny_models.py) has 4 layers: layer 3 is NoPE. Rotating it, or
leaving another layer unrotated, moves every logit after the first token.
"""

import pytest
import torch
import transformers

from pagoda.engine import LLM
from pagoda.engine.errors import ModelLoadError
from pagoda.engine.loading.gguf import GGUFModelFile
from pagoda.engine.models.config import head_dim
from pagoda.engine.models.smollm3 import architecture, config_from_gguf, rotated_layers
from tests.engine.family_parity import (
    LLAMA_CPP_QUANTIZED_NEAR_TIE,
    FakeGGUFSettings,
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
from tests.engine.models.test_native_decode import PROMPTS, _decoding, _engine
from tests.engine.models.test_native_decode_layers import _assert_fused_steps_are_eager
from tests.engine.models.test_parity import NUM_THREADS, assert_greedy_parity, parity_prompts
from tests.engine.quantization.test_cpu_q4 import q4, q4_chosen  # noqa: F401 (fixtures)

pytestmark = pytest.mark.usefixtures("fresh_gguf_metadata_cache")


@pytest.fixture(scope="module")
def smollm3(llama_cpp_ggufs):
    """(folder, gguf file)"""
    return llama_cpp_ggufs["smollm3"]


@pytest.fixture(scope="module")
def prompts(smollm3) -> list[list[int]]:
    return parity_prompts(transformers.AutoTokenizer.from_pretrained(smollm3[0]))


@pytest.fixture(scope="module")
def hf_model(smollm3):
    return load_hf_model(smollm3[0])


def test_smollm3_folder_predicts_transformers_next_token_at_every_position(
        smollm3, hf_model, prompts):
    for i, (ours, theirs) in enumerate(zip(engine_logits(smollm3[0], prompts),
                                           hf_logits(hf_model, prompts), strict=True)):
        assert_same_argmax(ours, theirs, f"prompt {i}")
        torch.testing.assert_close(ours, theirs, atol=1e-4, rtol=1e-4)


def test_smollm3_greedy_through_the_scheduler_matches_transformers(smollm3, hf_model, prompts):
    llm = LLM(str(smollm3[0]), num_kv_blocks=128, num_threads=NUM_THREADS,
              max_num_batched_tokens=16)
    assert_greedy_parity(llm, hf_model, prompts)


def test_smollm3_gguf_gives_the_folders_logits_to_fp16_rounding(smollm3, prompts):
    """The converter interleaves q and k rows as for Llama (every layer's, NoPE or not) and
    does not say which layers are NoPE: the loader undoes the one and takes llama.cpp's every
    fourth for the other."""
    reference = round_matrices_to_fp16(load_hf_model(smollm3[0]))
    for ours, theirs in zip(engine_logits(smollm3[1], prompts), hf_logits(reference, prompts),
                            strict=True):
        torch.testing.assert_close(ours, theirs, atol=1e-4, rtol=1e-4)


def test_smollm3_gguf_config_states_what_the_folders_does(smollm3):
    want = transformers.AutoConfig.from_pretrained(smollm3[0])
    got = config_from_gguf(GGUFModelFile(smollm3[1]))

    for field in ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                  "num_key_value_heads", "max_position_embeddings", "vocab_size", "no_rope_layers", "layer_types", "sliding_window", "tie_word_embeddings",
                  "attention_bias", "mlp_bias", "bos_token_id", "eos_token_id"):
        assert getattr(got, field, None) == getattr(want, field, None), field
    assert got.rope_parameters["rope_theta"] == want.rope_parameters["rope_theta"]
    assert head_dim(got) == head_dim(want)


def test_smollm3_gguf_chat_template_and_tokens_are_the_files(smollm3, tmp_path):
    """Read without transformers' AutoTokenizer, which refuses an architecture it does not know."""
    assert_gguf_tokenizer_is_the_folders(smollm3[1], smollm3[0], tmp_path)


def test_smollm3_gguf_greedy_tokens_equal_llama_cpps(smollm3):
    record, = llama_cpp_records("tiny_families.json", family="smollm3", type="f16")
    assert not greedy_disagreements_with_llama_cpp(smollm3[1], record)


def test_smollm3_q4_k_m_greedy_tokens_equal_llama_cpps(smollm3, tmp_path):
    """llama-quantize's Q4_K_M (with rows 64 wide: Q5_0 layers, a Q8_0 embedding), which we
    read exactly; llama.cpp also rounds activations to 8 bits, so ties are wider."""
    q4 = quantize_with_llama_cpp(smollm3[1], tmp_path / "tiny-smollm3.Q4_K_M.gguf")
    record, = llama_cpp_records("tiny_families.json", family="smollm3", type="Q4_K_M")
    assert not greedy_disagreements_with_llama_cpp(q4, record, LLAMA_CPP_QUANTIZED_NEAR_TIE)


def test_smollm3_decode_steps_run_in_one_c_call_with_the_eager_logits(q4, q4_chosen, smollm3):
    """Quantized to int4, every linear has a C kernel: the one-call step rotates layers 0-2 and
    leaves layer 3 unrotated, as the eager path does."""
    engine = _engine(smollm3[0], quantization="int4")
    _decoding(engine, PROMPTS, steps=2)
    _assert_fused_steps_are_eager(engine, steps=3)


def test_smollm3_layers_marked_0_in_no_rope_layers_are_nope():
    config = transformers.SmolLM3Config(num_hidden_layers=6, hidden_size=64, num_attention_heads=4,
                                        num_key_value_heads=2, no_rope_layers=[1, 0, 1, 1, 0, 1])
    assert [kind.rope for kind in architecture(config).layers] == [
        "default", None, "default", "default", None, "default"]


def test_a_smollm3_whose_mlp_activation_pagoda_does_not_run_is_refused():
    config = transformers.SmolLM3Config(num_hidden_layers=4, hidden_size=64, num_attention_heads=4,
                                        num_key_value_heads=2, hidden_act="relu")
    with pytest.raises(ModelLoadError, match="'relu'"):
        architecture(config)


@pytest.mark.parametrize("flags", [[1, 1, 1], [1, 1, 2, 0]])
def test_a_damaged_no_rope_layers_list_is_refused(flags):
    config = transformers.SmolLM3Config(num_hidden_layers=4, hidden_size=64,
                                        num_attention_heads=4, num_key_value_heads=2)
    config.no_rope_layers = flags
    with pytest.raises(ModelLoadError, match="no_rope_layers"):
        rotated_layers(config)


_SMOLLM3_KEYS = {"smollm3.embedding_length": 64, "smollm3.attention.head_count": 4,
                 "smollm3.attention.head_count_kv": 2, "smollm3.block_count": 4,
                 "smollm3.feed_forward_length": 128, "smollm3.context_length": 65536,
                 "smollm3.rope.freq_base": 5e6}


def test_a_smollm3_files_yarn_scaling_is_read_as_transformers_states_it():
    """SmolLM3's model card extends it to 128k tokens with YaRN: the converter writes it as keys."""
    keys = _SMOLLM3_KEYS | {"smollm3.rope.scaling.type": "yarn", "smollm3.rope.scaling.factor": 2.0,
                            "smollm3.rope.scaling.original_context_length": 65536}
    config = config_from_gguf(FakeGGUFSettings("smollm3", keys, {}))
    assert config.rope_parameters == {"rope_type": "yarn", "rope_theta": 5e6, "factor": 2.0,
                                      "original_max_position_embeddings": 65536}
    assert [kind.rope for kind in architecture(config).layers] == ["default"] * 3 + [None]


@pytest.mark.parametrize(("keys", "vectors", "words"), [
    ({"smollm3.rope.scaling.type": "longrope"}, {}, "'longrope'"),
    ({}, {"rope_freqs.weight": [1.0] * 8}, "a rope_freqs tensor"),
])
def test_a_smollm3_file_scaled_in_a_way_pagoda_does_not_read_is_refused(keys, vectors, words):
    with pytest.raises(ModelLoadError, match=words):
        config_from_gguf(FakeGGUFSettings("smollm3", _SMOLLM3_KEYS | keys, vectors))


def test_a_smollm3_file_whose_eos_token_is_not_a_token_id_is_refused():
    keys = _SMOLLM3_KEYS | {"tokenizer.ggml.eos_token_id": [2, 7]}
    with pytest.raises(ModelLoadError, match="tokenizer.ggml.eos_token_id"):
        config_from_gguf(FakeGGUFSettings("smollm3", keys, {}))
