"""LFM2 (short convolutions beside attention) runs as transformers defines it, from a model
folder and from the GGUF llama.cpp's converter writes of it, with each sequence's convolution
state in a slot of its own beside the paged KV cache: whatever the chunking, the batch,
preemption or a repeated prompt, a request gets the same greedy tokens.

The tiny model (tests/engine/tiny_models.py) has 6 layers: 1 and 4 attend, the others are
short convolutions of 3 taps.
"""

import logging
from dataclasses import replace

import pytest
import torch
import transformers

from pagoda.engine import LLM
from pagoda.engine.errors import ModelLoadError
from pagoda.engine.loading.gguf import GGUFModelFile
from pagoda.engine.models.lfm2 import architecture, config_from_gguf, mlp_width
from pagoda.engine.models.native_decode import not_covered
from pagoda.engine.models.registry import architecture_of
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
    greedy_tokens,
    tokens_alone,
)
from tests.engine.llama_cpp_converter import (
    convert_to_gguf,
    gguf_model_name,
    quantize_with_llama_cpp,
)
from tests.engine.llama_cpp_references import llama_cpp_records
from tests.engine.models.test_parity import NUM_THREADS, assert_greedy_parity, parity_prompts
from tests.engine.tiny_models import save_tiny_model

ATTENTION_LAYERS = (1, 4)

pytestmark = pytest.mark.usefixtures("fresh_gguf_metadata_cache")


@pytest.fixture(scope="module")
def lfm2(tmp_path_factory):
    return save_tiny_model(tmp_path_factory.mktemp("lfm2"), "lfm2")


@pytest.fixture(scope="module")
def lfm2_gguf(lfm2):
    """llama.cpp's converter's f16 file of the tiny model."""
    return convert_to_gguf(lfm2, lfm2.parent / "tiny-lfm2.f16.gguf", name=gguf_model_name("lfm2"))


@pytest.fixture(scope="module")
def prompts(lfm2) -> list[list[int]]:
    return parity_prompts(transformers.AutoTokenizer.from_pretrained(lfm2))


@pytest.fixture(scope="module")
def hf_model(lfm2):
    return load_hf_model(lfm2)


@pytest.fixture(scope="module")
def long_prompts(lfm2) -> list[list[int]]:
    return hybrid_checks.long_prompts(lfm2)


@pytest.fixture(scope="module")
def alone(lfm2, long_prompts) -> list[list[int]]:
    return tokens_alone(lfm2, long_prompts)


def test_lfm2_folder_predicts_transformers_next_token_at_every_position(lfm2, hf_model, prompts):
    """Prefilled in 16-token chunks: each chunk's convolutions start from the state the one
    before left, its attention from the keys it cached."""
    for i, (ours, theirs) in enumerate(zip(engine_logits(lfm2, prompts),
                                           hf_logits(hf_model, prompts), strict=True)):
        assert_same_argmax(ours, theirs, f"prompt {i}")
        torch.testing.assert_close(ours, theirs, atol=1e-4, rtol=1e-4)


def test_lfm2_greedy_through_the_scheduler_matches_transformers(lfm2, hf_model, prompts):
    llm = LLM(str(lfm2), num_kv_blocks=128, num_threads=NUM_THREADS, max_num_batched_tokens=16)
    assert_greedy_parity(llm, hf_model, prompts)
    assert_all_slots_free(llm)


def test_lfm2_greedy_tokens_do_not_depend_on_the_prefill_chunk(lfm2, long_prompts, alone):
    """7-token chunks (prime, so chunks end anywhere in the convolution's window) and prompts
    batched with each other's chunks and decodes."""
    assert_chunks_keep_the_tokens(lfm2, long_prompts, alone)


def test_lfm2_greedy_tokens_do_not_depend_on_the_batch(lfm2, long_prompts, alone):
    assert_the_batch_keeps_the_tokens(lfm2, long_prompts, alone)


def test_lfm2_preempted_requests_restart_and_get_the_tokens_they_get_alone(
        lfm2, long_prompts, alone):
    """22 blocks of 16 tokens hold the longest request (324 tokens) but not all of them: the
    newest are preempted, lose their state with their slot, and recompute from their first
    token."""
    assert_preemption_keeps_the_tokens(lfm2, long_prompts, alone)


def test_lfm2_runs_no_more_sequences_than_it_has_state_slots(lfm2, long_prompts, alone,
                                                             monkeypatch):
    llm = LLM(str(lfm2), num_threads=NUM_THREADS, num_kv_blocks=64)
    pool = llm.engine.state_pool
    # Two slots, as if the memory budget held no more.
    monkeypatch.setattr(pool, "_free", [1, 0])
    monkeypatch.setattr(pool, "num_slots", 2)
    scheduler, most = llm.engine.scheduler, []

    def counting_schedule():
        out = type(scheduler).schedule(scheduler)
        most.append(len(scheduler.running))
        return out

    monkeypatch.setattr(scheduler, "schedule", counting_schedule)
    assert greedy_tokens(llm, long_prompts) == alone
    assert max(most) == 2
    assert_all_slots_free(llm)


def test_a_one_token_prompt_starts_from_no_state_in_a_slot_used_before(lfm2, long_prompts):
    """A one-token prompt runs with the decodes, which read their slot: the slot another
    sequence left must not leak into it."""
    fresh = LLM(str(lfm2), num_threads=NUM_THREADS, num_kv_blocks=64)
    want = greedy_tokens(fresh, [[long_prompts[0][0]]])
    used = LLM(str(lfm2), num_threads=NUM_THREADS, num_kv_blocks=64)
    greedy_tokens(used, [long_prompts[1]])
    assert greedy_tokens(used, [[long_prompts[0][0]]]) == want


def test_an_aborted_lfm2_request_gives_its_slot_back(lfm2, long_prompts):
    assert_aborts_give_the_slots_back(lfm2, long_prompts)


def test_a_repeated_lfm2_prompt_starts_from_its_prompt_end_checkpoint(lfm2, long_prompts,
                                                                     alone):
    """A cached block holds keys, not the convolutions' state at its end: a prompt seen before
    starts at its last block boundary (300 tokens: 288), where its states were checkpointed."""
    llm = LLM(str(lfm2), num_threads=NUM_THREADS, num_kv_blocks=64)
    first = llm.generate([long_prompts[0]], GREEDY)[0]
    again = llm.generate([long_prompts[0]], GREEDY)[0]
    assert first.outputs[0].token_ids == again.outputs[0].token_ids == alone[0]
    assert again.num_cached_tokens == 288
    assert_all_slots_free(llm)


def test_lfm2_keeps_speculation_and_the_disk_tier_on(lfm2, tmp_path, caplog):
    """Speculative decoding runs (the verifying step keeps the states after each draft:
    tests/engine/spec_decode/test_hybrid_spec_decode.py); the disk tier keeps checkpoints beside
    the blocks (tests/engine/disk_cache/test_disk_cache_checkpoints.py): nothing is off."""
    with caplog.at_level(logging.INFO, logger="pagoda.engine.llm_engine"):
        llm = LLM(str(lfm2), num_threads=NUM_THREADS, num_kv_blocks=16,
                  num_speculative_tokens=3, disk_cache_dir=tmp_path / "disk")
    engine = llm.engine
    assert engine.scheduler.proposer is not None
    assert engine.disk_cache is not None and engine.disk_cache.state_io is not None
    assert engine.kv_cache.checkpoints is not None
    assert not any("off for this model" in r.getMessage() for r in caplog.records)


def test_only_lfm2_attention_layers_hold_kv_blocks(lfm2):
    llm = LLM(str(lfm2), num_threads=NUM_THREADS, num_kv_blocks=16)
    runner = llm.engine.runner
    assert runner.kv_layout == [(0, ATTENTION_LAYERS)]
    shape = runner.model.shape
    assert runner.bytes_per_block() == (2 * runner.block_size * len(ATTENTION_LAYERS)
                                        * shape.num_kv_heads * shape.head_dim * 4)
    conv = [i for i, caches in enumerate(runner.kv_caches) if caches is None]
    assert conv == [0, 2, 3, 5]
    # Each convolution layer's state: its last 2 inputs of 64 channels, fp32.
    assert runner.bytes_per_state_slot == 4 * 64 * 2 * 4
    # The running sequences' slots, then the checkpoints'.
    assert [states[0].shape for states in runner.recurrent_states if states is not None] == [
        (runner.num_state_slots + runner.num_checkpoint_slots, 64, 2)] * 4


def test_lfm2_layers_are_all_ones_the_one_call_c_decode_step_runs(lfm2):
    """Its short convolutions and attention (tests/engine/models/test_native_decode_hybrid.py
    runs them)."""
    arch = architecture_of(transformers.AutoConfig.from_pretrained(lfm2))
    assert not_covered(arch) is None


@pytest.mark.parametrize(("settings", "width"), [
    ({"intermediate_size": 12288}, 8192),  # LFM2-1.2B: block_ff_dim 12288 -> 8192
    ({"intermediate_size": 200, "block_multiple_of": 32}, 160),
    ({"intermediate_size": 200, "block_auto_adjust_ff_dim": False}, 200),
    ({"intermediate_size": 300, "block_ffn_dim_multiplier": 1.5, "block_multiple_of": 64}, 320),
])
def test_lfm2_mlp_width_is_transformers(settings, width):
    config = transformers.Lfm2Config(hidden_size=64, num_attention_heads=4, num_key_value_heads=2,
                                     num_hidden_layers=2, **settings)
    assert mlp_width(config) == width
    model = transformers.Lfm2ForCausalLM(transformers.Lfm2Config(
        hidden_size=8, num_attention_heads=2, num_key_value_heads=1, num_hidden_layers=1,
        vocab_size=16, **settings))
    assert model.model.layers[0].feed_forward.w1.out_features == width


def test_lfm2_layers_follow_full_attn_idxs_when_layer_types_is_absent():
    config = transformers.Lfm2Config(hidden_size=64, num_attention_heads=4, num_key_value_heads=2,
                                     num_hidden_layers=5, full_attn_idxs=[2, 4])
    arch = architecture(config)
    assert arch.shape.recurrent_layers == frozenset({0, 1, 3})
    assert [type(kind).__name__ for kind in arch.layers] == [
        "ShortConvKind", "ShortConvKind", "AttentionKind", "ShortConvKind", "AttentionKind"]


def test_the_fit_check_counts_lfm2_attention_layers_kv_and_the_states(lfm2):
    """What the memory check reads from config.json before loading is what the engine takes:
    the attention layers' KV, a state slot per sequence it may run, and the states'
    checkpoints (which take a share of the same budget, in whole blocks' stead)."""
    from pagoda.engine.config import EngineConfig
    from pagoda.engine.loading.model_info import _folder_shape
    from pagoda.engine.models.kv_cache_sizing import model_kv_cache_bytes

    shape = _folder_shape(lfm2)
    assert shape.recurrent_layers == frozenset({0, 2, 3, 5})
    config = EngineConfig(max_model_len=256, kv_cache_memory=None, num_threads=NUM_THREADS)
    per_token = 2 * len(ATTENTION_LAYERS) * shape.num_kv_heads * shape.head_dim * 4
    per_slot = 4 * 64 * 2 * 4  # 4 convolutions' last 2 inputs of 64 channels, fp32
    budget = 2 * 256 * per_token + config.max_num_seqs * per_slot
    runner = LLM(str(lfm2), max_model_len=256, num_threads=NUM_THREADS).engine.runner
    taken = (sum(g.num_blocks * g.bytes_per_block for g in runner.kv_cache_groups)
             + (runner.num_state_slots + runner.num_checkpoint_slots) * per_slot)
    assert runner.num_checkpoint_slots >= 2
    assert model_kv_cache_bytes(shape, config) == taken
    assert budget - per_token * config.block_size < taken <= budget


def test_lfm2_gguf_gives_the_folders_logits_to_fp16_rounding(lfm2, lfm2_gguf, prompts):
    """The converter writes the convolutions' taps [channels, kernel] (float32) and the MLP's
    adjusted width; the attention layers are those with key-value heads."""
    reference = round_matrices_to_fp16(load_hf_model(lfm2))
    for ours, theirs in zip(engine_logits(lfm2_gguf, prompts), hf_logits(reference, prompts),
                            strict=True):
        torch.testing.assert_close(ours, theirs, atol=1e-4, rtol=1e-4)


def test_lfm2_gguf_config_states_what_the_folders_does(lfm2, lfm2_gguf):
    want = architecture(transformers.AutoConfig.from_pretrained(lfm2))
    got = architecture(config_from_gguf(GGUFModelFile(lfm2_gguf)))
    assert got.shape.rms_norm_eps == pytest.approx(want.shape.rms_norm_eps)  # a float32 key
    assert replace(got.shape, rms_norm_eps=want.shape.rms_norm_eps) == want.shape
    assert got.layers == want.layers
    assert got.ropes == want.ropes
    assert got.tied_embeddings == want.tied_embeddings


def test_lfm2_gguf_chat_template_and_tokens_are_the_files(lfm2, lfm2_gguf, tmp_path):
    assert_gguf_tokenizer_is_the_folders(lfm2_gguf, lfm2, tmp_path)


def test_lfm2_gguf_greedy_tokens_equal_llama_cpps(lfm2_gguf):
    record, = llama_cpp_records("tiny_hybrid.json", family="lfm2", type="f16")
    assert not greedy_disagreements_with_llama_cpp(lfm2_gguf, record)


def test_lfm2_q4_k_m_greedy_tokens_equal_llama_cpps(lfm2_gguf, tmp_path):
    """llama-quantize's Q4_K_M of the tiny model (rows 64 wide: Q5_0 and Q8_0), where a build is
    at hand; llama.cpp rounds activations to 8 bits, so its ties are wider."""
    q4 = quantize_with_llama_cpp(lfm2_gguf, tmp_path / "tiny-lfm2.Q4_K_M.gguf")
    record, = llama_cpp_records("tiny_hybrid.json", family="lfm2", type="Q4_K_M")
    assert not greedy_disagreements_with_llama_cpp(q4, record, LLAMA_CPP_QUANTIZED_NEAR_TIE)


_LFM2_KEYS = {"lfm2.embedding_length": 64, "lfm2.attention.head_count": 4,
              "lfm2.block_count": 3, "lfm2.feed_forward_length": 160,
              "lfm2.context_length": 4096, "lfm2.shortconv.l_cache": 3}


@pytest.mark.parametrize("kv_heads", [2, [0, 2], [0, 2, 4], [0, 0, 0], [0, -1, 2], None])
def test_an_lfm2_file_that_does_not_list_its_attention_layers_is_refused(kv_heads):
    keys = _LFM2_KEYS | {"lfm2.attention.head_count_kv": kv_heads}
    with pytest.raises(ModelLoadError, match="head_count_kv"):
        config_from_gguf(FakeGGUFSettings("lfm2", keys, {}))
