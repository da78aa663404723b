"""Qwen3.5 (Gated DeltaNet beside gated attention) runs as transformers defines it, from a model
folder and from the GGUF llama.cpp's converter writes of it (value heads tiled), with each
sequence's DeltaNet states in a slot of its own beside the paged KV cache: whatever the
chunking, the batch or preemption, a request gets the same greedy tokens.

The tiny model (tests/engine/tiny_models.py) has 8 layers: 3 and 7 attend (gated, a quarter of
each head rotated), the others are Gated DeltaNets of 2 key heads and 4 value heads of 16.
"""

from dataclasses import replace

import pytest
import torch
import transformers

from pagoda.engine import LLM
from pagoda.engine.errors import ModelLoadError
from pagoda.engine.loading.gguf import GGUFModelFile
from pagoda.engine.models.architecture import AttentionKind, GatedDeltaNetKind
from pagoda.engine.models.qwen3_5 import architecture, config_from_gguf
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
from tests.engine import hybrid_checks
from tests.engine.hf_reference import load_hf_model
from tests.engine.hybrid_checks import (
    GREEDY,
    assert_aborts_give_the_slots_back,
    assert_all_slots_free,
    assert_chunks_keep_the_tokens,
    assert_preemption_keeps_the_tokens,
    assert_the_batch_keeps_the_tokens,
    tokens_alone,
)
from tests.engine.llama_cpp_converter import (
    convert_to_gguf,
    gguf_model_name,
    quantize_with_llama_cpp,
)
from tests.engine.llama_cpp_references import llama_cpp_records
from tests.engine.models.test_parity import NUM_THREADS, assert_greedy_parity, parity_prompts
from tests.engine.multimodal_folders import save_as_multimodal
from tests.engine.tiny_models import save_tiny_model, tiny_config

ATTENTION_LAYERS = (3, 7)
# A DeltaNet layer's state per slot, in floats: the convolution's last 3 inputs of its 128
# channels (q and k: 2 heads of 16 each, v: 4 heads of 16), and 4 value heads' 16 x 16 matrices.
DELTA_NET_FLOATS = 128 * 3 + 4 * 16 * 16


@pytest.fixture(scope="module")
def qwen35(tmp_path_factory):
    return save_tiny_model(tmp_path_factory.mktemp("qwen35"), "qwen3.5")


@pytest.fixture(scope="module")
def qwen35_gguf(qwen35):
    """llama.cpp's converter's f16 file of the tiny model."""
    return convert_to_gguf(qwen35, qwen35.parent / "tiny-qwen3.5.f16.gguf",
                           name=gguf_model_name("qwen3.5"))


@pytest.fixture(scope="module")
def prompts(qwen35) -> list[list[int]]:
    return parity_prompts(transformers.AutoTokenizer.from_pretrained(qwen35))


@pytest.fixture(scope="module")
def hf_model(qwen35):
    return load_hf_model(qwen35)


@pytest.fixture(scope="module")
def long_prompts(qwen35) -> list[list[int]]:
    return hybrid_checks.long_prompts(qwen35)


@pytest.fixture(scope="module")
def alone(qwen35, long_prompts) -> list[list[int]]:
    return tokens_alone(qwen35, long_prompts)


def test_qwen3_5_folder_predicts_transformers_next_token_at_every_position(qwen35, hf_model,
                                                                           prompts):
    """Prefilled in 16-token chunks: each chunk's DeltaNets start from the states the one
    before left, its attention from the keys it cached."""
    for i, (ours, theirs) in enumerate(zip(engine_logits(qwen35, prompts),
                                           hf_logits(hf_model, prompts), strict=True)):
        assert_same_argmax(ours, theirs, f"prompt {i}")
        torch.testing.assert_close(ours, theirs, atol=1e-4, rtol=1e-4)


def test_qwen3_5_greedy_through_the_scheduler_matches_transformers(qwen35, hf_model, prompts):
    llm = LLM(str(qwen35), num_kv_blocks=128, num_threads=NUM_THREADS,
              max_num_batched_tokens=16)
    assert_greedy_parity(llm, hf_model, prompts)
    assert_all_slots_free(llm)


def test_qwen3_5_greedy_tokens_do_not_depend_on_the_prefill_chunk(qwen35, long_prompts, alone):
    """7-token chunks (prime, so chunks end anywhere in the convolution's window and the delta
    rule's chunks) and prompts batched with each other's chunks and decodes."""
    assert_chunks_keep_the_tokens(qwen35, long_prompts, alone)


def test_qwen3_5_greedy_tokens_do_not_depend_on_the_batch(qwen35, long_prompts, alone):
    assert_the_batch_keeps_the_tokens(qwen35, long_prompts, alone)


def test_qwen3_5_preempted_requests_restart_and_get_the_tokens_they_get_alone(
        qwen35, long_prompts, alone):
    """22 blocks of 16 tokens hold the longest request (324 tokens) but not all of them: the
    newest are preempted, lose their states with their slot, and recompute from their first
    token."""
    assert_preemption_keeps_the_tokens(qwen35, long_prompts, alone)


def test_an_aborted_qwen3_5_request_gives_its_slot_back(qwen35, long_prompts):
    assert_aborts_give_the_slots_back(qwen35, long_prompts)


def test_only_qwen3_5_attention_layers_hold_kv_blocks(qwen35):
    llm = LLM(str(qwen35), num_threads=NUM_THREADS, num_kv_blocks=16)
    runner = llm.engine.runner
    assert runner.kv_layout == [(0, ATTENTION_LAYERS)]
    shape = runner.model.shape
    assert runner.bytes_per_block() == (2 * runner.block_size * len(ATTENTION_LAYERS)
                                        * shape.num_kv_heads * shape.head_dim * 4)
    delta_nets = [i for i, caches in enumerate(runner.kv_caches) if caches is None]
    assert delta_nets == [0, 1, 2, 4, 5, 6]
    assert runner.bytes_per_state_slot == 6 * DELTA_NET_FLOATS * 4
    assert [tuple(t.shape[1:]) for t in runner.recurrent_states[0]] == [(128, 3), (4, 16, 16)]


def test_the_fit_check_counts_what_the_qwen3_5_engine_allocates(qwen35):
    """What the memory check reads from config.json before loading is what the engine takes:
    the attention layers' KV blocks, a DeltaNet state slot per sequence it may run, and the
    states' checkpoints."""
    from pagoda.engine.config import EngineConfig
    from pagoda.engine.loading.model_info import _folder_shape
    from pagoda.engine.models.kv_cache_sizing import model_kv_cache_bytes

    shape = _folder_shape(qwen35)
    assert shape.recurrent_layers == frozenset({0, 1, 2, 4, 5, 6})
    assert shape.state_floats == 6 * DELTA_NET_FLOATS
    config = EngineConfig(max_model_len=256, kv_cache_memory=None, num_threads=NUM_THREADS)
    runner = LLM(str(qwen35), max_model_len=256, num_threads=NUM_THREADS).engine.runner
    allocated = (sum(g.num_blocks * g.bytes_per_block for g in runner.kv_cache_groups)
                 + (runner.num_state_slots + runner.num_checkpoint_slots)
                 * runner.bytes_per_state_slot)
    assert model_kv_cache_bytes(shape, config) == allocated


def test_a_repeated_qwen3_5_prompt_starts_from_its_prompt_end_checkpoint(qwen35, long_prompts,
                                                                        alone):
    """A prompt seen before starts at its last block boundary (300 tokens: 288), where its
    DeltaNets' states were checkpointed, and gets the tokens it got alone."""
    llm = LLM(str(qwen35), num_threads=NUM_THREADS, num_kv_blocks=64)
    first = llm.generate([long_prompts[0]], GREEDY)[0]
    again = llm.generate([long_prompts[0]], GREEDY)[0]
    assert first.outputs[0].token_ids == again.outputs[0].token_ids == alone[0]
    assert again.num_cached_tokens == 288
    assert_all_slots_free(llm)


def test_qwen3_5_layers_are_gated_delta_nets_and_gated_attention():
    arch = architecture(tiny_config("qwen3.5", vocab_size=64))
    assert arch.layers[3] == arch.layers[7] == AttentionKind(output_gate=True)
    assert arch.layers[0] == GatedDeltaNetKind(num_k_heads=2, num_v_heads=4, k_dim=16, v_dim=16,
                                               conv_kernel=4)
    assert arch.norm_offset == 1.0
    assert arch.ropes["default"].rotary_dim == 4




@pytest.mark.parametrize(("settings", "words"), [
    ({"linear_num_value_heads": 3}, "value heads"),
    ({"attention_bias": True}, "attention_bias"),
    ({"hidden_act": "gelu"}, "SiLU"),
])
def test_qwen3_5_settings_pagoda_does_not_run_are_refused(settings, words):
    config = tiny_config("qwen3.5", vocab_size=64)
    for key, value in settings.items():
        setattr(config, key, value)
    with pytest.raises(ModelLoadError, match=words):
        architecture(config)


def test_qwen3_5_gguf_gives_the_folders_logits_to_fp16_rounding(qwen35, qwen35_gguf, prompts):
    """The converter tiles the DeltaNets' value heads over the key heads (attn_qkv's v rows,
    attn_gate, ssm_beta, ssm_alpha, ssm_a, ssm_dt, ssm_conv1d's v channels, ssm_out's columns),
    holds A_log as -exp(A_log) and the (1 + w) norms as 1 + w: loaded as they are."""
    reference = round_matrices_to_fp16(load_hf_model(qwen35))
    for ours, theirs in zip(engine_logits(qwen35_gguf, prompts), hf_logits(reference, prompts),
                            strict=True):
        torch.testing.assert_close(ours, theirs, atol=1e-4, rtol=1e-4)


def test_qwen3_5_gguf_config_states_what_the_folders_does(qwen35, qwen35_gguf):
    want = architecture(transformers.AutoConfig.from_pretrained(qwen35))
    got = architecture(config_from_gguf(GGUFModelFile(qwen35_gguf)))
    assert got.shape.rms_norm_eps == pytest.approx(want.shape.rms_norm_eps)  # a float32 key
    assert replace(got.shape, rms_norm_eps=want.shape.rms_norm_eps) == want.shape
    assert got.layers == tuple(replace(kind, tiled=True) if isinstance(kind, GatedDeltaNetKind)
                               else kind for kind in want.layers)
    assert got.ropes["default"].rotary_dim == want.ropes["default"].rotary_dim
    assert got.tied_embeddings == want.tied_embeddings


def test_qwen3_5_gguf_chat_template_and_tokens_are_the_files(qwen35, qwen35_gguf, tmp_path):
    assert_gguf_tokenizer_is_the_folders(qwen35_gguf, qwen35, tmp_path)


def test_qwen3_5_gguf_greedy_tokens_equal_llama_cpps(qwen35_gguf):
    record, = llama_cpp_records("tiny_hybrid.json", family="qwen3.5", type="f16")
    assert not greedy_disagreements_with_llama_cpp(qwen35_gguf, record)


def test_qwen3_5_q4_k_m_greedy_tokens_equal_llama_cpps(qwen35_gguf, tmp_path):
    """llama-quantize's Q4_K_M of the tiny model, where a build is at hand; its quantized
    DeltaNet projections are read in the converter's tiled order, never permuted."""
    q4 = quantize_with_llama_cpp(qwen35_gguf, tmp_path / "tiny-qwen3.5.Q4_K_M.gguf")
    record, = llama_cpp_records("tiny_hybrid.json", family="qwen3.5", type="Q4_K_M")
    assert not greedy_disagreements_with_llama_cpp(q4, record, LLAMA_CPP_QUANTIZED_NEAR_TIE)


_QWEN35_KEYS = {"qwen35.embedding_length": 64, "qwen35.attention.head_count": 4,
                "qwen35.attention.head_count_kv": 2, "qwen35.attention.key_length": 16,
                "qwen35.block_count": 4, "qwen35.feed_forward_length": 128,
                "qwen35.context_length": 512, "qwen35.rope.dimension_count": 4,
                "qwen35.ssm.conv_kernel": 4, "qwen35.ssm.state_size": 16,
                "qwen35.ssm.group_count": 2, "qwen35.ssm.time_step_rank": 4,
                "qwen35.ssm.inner_size": 64}
_NO_VECTORS: dict[str, list[float]] = {}


def test_a_qwen35_file_without_recurrent_layers_attends_every_fourth_layer():
    config = config_from_gguf(FakeGGUFSettings("qwen35", _QWEN35_KEYS, _NO_VECTORS))
    assert config.layer_types == ["linear_attention"] * 3 + ["full_attention"]


@pytest.mark.parametrize(("keys", "words"), [
    ({"qwen35.attention.recurrent_layers": [True, False]}, "recurrent_layers"),
    ({"qwen35.ssm.time_step_rank": 3}, "time_step_rank"),
])
def test_a_qwen35_file_that_does_not_fit_its_layers_is_refused(keys, words):
    with pytest.raises(ModelLoadError, match=words):
        config_from_gguf(FakeGGUFSettings("qwen35", _QWEN35_KEYS | keys, _NO_VECTORS))


@pytest.fixture(scope="module")
def multimodal(qwen35, tmp_path_factory):
    """The tiny Qwen3.5 as Qwen3.5 is released: Qwen3_5ForConditionalGeneration (a small vision
    encoder beside it), the text model's weights the tiny folder's."""
    return save_as_multimodal(qwen35, tmp_path_factory.mktemp("qwen35_multimodal"),
                              transformers.Qwen3_5Config, transformers.Qwen3_5ForConditionalGeneration)


def test_a_qwen3_5_multimodal_folder_runs_its_text_model(multimodal, hf_model, prompts):
    """Its weights under model.language_model. read as the text folder's; the vision encoder
    not read."""
    saved = transformers.AutoConfig.from_pretrained(multimodal)
    assert saved.model_type == "qwen3_5"
    for ours, theirs in zip(engine_logits(multimodal, prompts), hf_logits(hf_model, prompts),
                            strict=True):
        torch.testing.assert_close(ours, theirs, atol=1e-4, rtol=1e-4)
