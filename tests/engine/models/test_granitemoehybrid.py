"""Granite 4 hybrids (Mamba-2 layers beside attention) run as transformers defines them, from a
model folder and from the GGUF llama.cpp's converter writes of one, with each sequence's Mamba
states in a slot of its own beside the paged KV cache: whatever the chunking, the batch or
preemption, a request gets the same greedy tokens.

The tiny models (tests/engine/tiny_models.py) have 6 layers: 1 and 4 attend, the others are
Mamba-2 layers; "granite-hybrid" has a dense MLP and NoPE attention (as Granite-4.0-H-Micro),
"granite-hybrid-moe-rope" experts beside a shared expert and RoPE.
"""

import math
from dataclasses import replace

import pytest
import torch
import transformers

from pagoda.engine import LLM
from pagoda.engine.errors import ModelLoadError
from pagoda.engine.layers.mamba2 import Mamba2Mixer
from pagoda.engine.loading.gguf import GGUFModelFile
from pagoda.engine.models.architecture import AttentionKind, Mamba2Kind
from pagoda.engine.models.decoder import CPU_SCAN_CHUNK
from pagoda.engine.models.granitemoehybrid import architecture, config_from_gguf
from tests.engine.family_parity import (
    LLAMA_CPP_QUANTIZED_NEAR_TIE,
    FakeGGUFSettings,
    assert_gguf_tokenizer_is_the_folders,
    assert_same_argmax,
    engine_logits,
    greedy_disagreements_with_llama_cpp,
    hf_logits,
)
from tests.engine import hybrid_checks
from tests.engine.hf_reference import load_hf_model
from tests.engine.hybrid_checks import (
    assert_aborts_give_the_slots_back,
    assert_all_slots_free,
    assert_chunks_keep_the_tokens,
    assert_preemption_keeps_the_tokens,
    assert_the_batch_keeps_the_tokens,
    tokens_alone,
)
from tests.engine.llama_cpp_converter import convert_all, gguf_model_name, quantize_with_llama_cpp
from tests.engine.llama_cpp_references import llama_cpp_records
from tests.engine.models.test_parity import NUM_THREADS, assert_greedy_parity, parity_prompts
from tests.engine.tiny_models import save_tiny_model, tiny_config

ATTENTION_LAYERS = (1, 4)
MAMBA_LAYERS = (0, 2, 3, 5)
VARIANTS = ("granite-hybrid", "granite-hybrid-moe-rope")

pytestmark = pytest.mark.usefixtures("fresh_gguf_metadata_cache")


@pytest.fixture(scope="module", params=VARIANTS)
def granite(request, tmp_path_factory):
    return save_tiny_model(tmp_path_factory.mktemp(request.param), request.param)


@pytest.fixture(scope="module")
def dense(tmp_path_factory):
    return save_tiny_model(tmp_path_factory.mktemp("granite-hybrid"), "granite-hybrid")


@pytest.fixture(scope="module")
def ggufs(tmp_path_factory) -> dict[str, tuple]:
    """{variant: (folder, llama.cpp's converter's f16 file of it)}, the NoPE variants: the
    converter marks every Granite hybrid's attention unrotated (rope.scaling.finetuned false),
    so a RoPE folder's file is another model."""
    root = tmp_path_factory.mktemp("granite-gguf")
    variants = ("granite-hybrid", "granite-hybrid-moe")
    folders = {v: save_tiny_model(root / v, v) for v in variants}
    files = convert_all([(folders[v], root / f"tiny-{v}.f16.gguf", gguf_model_name(v))
                         for v in variants])
    return {v: (folders[v], f) for v, f in zip(variants, files, strict=True)}


@pytest.fixture(scope="module")
def long_prompts(dense) -> list[list[int]]:
    return hybrid_checks.long_prompts(dense)


@pytest.fixture(scope="module")
def alone(dense, long_prompts) -> list[list[int]]:
    return tokens_alone(dense, long_prompts)


def test_granite_folder_predicts_transformers_next_token_at_every_position(granite):
    """Prefilled in 16-token chunks: each chunk's Mamba layers start from the states the one
    before left (transformers scans in chunks of 8, ours of CPU_SCAN_CHUNK), its attention from
    the keys it cached."""
    prompts = parity_prompts(transformers.AutoTokenizer.from_pretrained(granite))
    hf_model = load_hf_model(granite)
    for i, (ours, theirs) in enumerate(zip(engine_logits(granite, prompts),
                                           hf_logits(hf_model, prompts), strict=True)):
        assert_same_argmax(ours, theirs, f"prompt {i}")
        torch.testing.assert_close(ours, theirs, atol=1e-4, rtol=1e-4)


def test_granite_greedy_through_the_scheduler_matches_transformers(granite):
    prompts = parity_prompts(transformers.AutoTokenizer.from_pretrained(granite))
    llm = LLM(str(granite), num_kv_blocks=128, num_threads=NUM_THREADS,
              max_num_batched_tokens=16)
    assert_greedy_parity(llm, load_hf_model(granite), prompts)
    assert_all_slots_free(llm)


def test_granite_greedy_tokens_do_not_depend_on_the_prefill_chunk(dense, long_prompts, alone):
    """7-token chunks (prime, so chunks end anywhere in the convolution's window and the scan's
    chunks) and prompts batched with each other's chunks and decodes."""
    assert_chunks_keep_the_tokens(dense, long_prompts, alone)


def test_granite_greedy_tokens_do_not_depend_on_the_batch(dense, long_prompts, alone):
    assert_the_batch_keeps_the_tokens(dense, long_prompts, alone)


def test_granite_preempted_requests_restart_and_get_the_tokens_they_get_alone(
        dense, long_prompts, alone):
    """22 blocks of 16 tokens hold the longest request (324 tokens) but not all of them: the
    newest are preempted, lose their states with their slot, and recompute from their first
    token."""
    assert_preemption_keeps_the_tokens(dense, long_prompts, alone)


def test_an_aborted_granite_request_gives_its_slot_back(dense, long_prompts):
    assert_aborts_give_the_slots_back(dense, long_prompts)


def test_only_granite_attention_layers_hold_kv_blocks(dense):
    llm = LLM(str(dense), num_threads=NUM_THREADS, num_kv_blocks=16)
    runner = llm.engine.runner
    assert runner.kv_layout == [(0, ATTENTION_LAYERS)]
    assert [i for i, caches in enumerate(runner.kv_caches) if caches is None] == list(
        MAMBA_LAYERS)
    # Each Mamba layer's states, fp32: the convolution's last 3 inputs of x|B|C (128 + 2 x 2 x
    # 16 = 192 channels) and 8 heads x 16 x a state of 16.
    per_layer = (192 * 3 + 8 * 16 * 16) * 4
    assert runner.bytes_per_state_slot == len(MAMBA_LAYERS) * per_layer
    mixer = runner.model.layers[0].mixer
    assert isinstance(mixer, Mamba2Mixer)
    assert mixer.config.chunk_size == CPU_SCAN_CHUNK  # config.json's 8 is a GPU tile


def test_the_fit_check_counts_the_mamba_states_the_engine_allocates(dense):
    """What the memory check reads from config.json before loading is what the engine takes:
    the attention layers' KV blocks, a slot of every Mamba layer's states per sequence, and
    the slots of their checkpoints."""
    from pagoda.engine.loading.model_info import _folder_shape
    from pagoda.engine.models.kv_cache_sizing import model_kv_cache_bytes

    llm = LLM(str(dense), num_threads=NUM_THREADS, max_model_len=256)
    runner = llm.engine.runner
    allocated = (runner.num_blocks * runner.bytes_per_block()
                 + (runner.num_state_slots + runner.num_checkpoint_slots)
                 * runner.bytes_per_state_slot)
    assert runner.num_checkpoint_slots >= 2
    shape = _folder_shape(dense)
    assert shape.state_floats * 4 == runner.bytes_per_state_slot
    assert model_kv_cache_bytes(shape, llm.engine.config) == allocated


def test_a_granite_folders_experts_count_as_routed(tmp_path):
    """Its released names (block_sparse_moe.input_linear / output_linear, every expert in one
    tensor each): 2 of 8 experts active per token."""
    from pagoda.engine.loading.model_info import describe_model

    folder = save_tiny_model(tmp_path / "moe", "granite-hybrid-moe")
    info = describe_model(folder)
    experts = 6 * 8 * 3 * 32 * 64  # layers x experts x (gate, up, down) x width x hidden
    assert info.num_parameters - info.num_active_parameters == experts * 6 // 8


def test_granite_architecture_reads_its_layers_and_scalars():
    arch = architecture(tiny_config("granite-hybrid-moe-rope", vocab_size=100))
    assert arch.shape.recurrent_layers == frozenset(MAMBA_LAYERS)
    mamba = arch.layers[0]
    assert isinstance(mamba, Mamba2Kind)
    assert (mamba.num_heads, mamba.head_dim, mamba.state_size, mamba.n_groups,
            mamba.conv_kernel) == (8, 16, 16, 2, 4)
    assert mamba.time_step_limit == (0.0, math.inf)
    assert arch.layers[1] == AttentionKind()  # rotated: position_embedding_type "rope"
    assert (arch.embedding_scale, arch.residual_scale, arch.logit_divisor,
            arch.attention_scale) == (12.0, 0.22, 3.0, 0.2)
    assert arch.moe.softmax_after_top_k and not arch.moe.shared_expert_gate
    assert arch.moe.shared_expert_size == 48
    dense = architecture(tiny_config("granite-hybrid", vocab_size=100))
    assert dense.layers[1] == AttentionKind(rope=None) and dense.ropes == {}
    assert dense.moe is None and dense.shape.intermediate_size == 96


@pytest.mark.parametrize(("settings", "what"), [
    ({"hidden_act": "gelu"}, "hidden_act"),
    ({"position_embedding_type": "alibi"}, "position_embedding_type"),
    ({"mamba_n_groups": 3}, "mamba_n_groups"),
])
def test_a_granite_config_pagoda_would_run_otherwise_is_refused(settings, what):
    config = tiny_config("granite-hybrid", vocab_size=100)
    for key, value in settings.items():
        setattr(config, key, value)
    with pytest.raises(ModelLoadError, match=what):
        architecture(config)


@pytest.mark.parametrize("variant", ["granite-hybrid", "granite-hybrid-moe"])
def test_granite_gguf_gives_the_folders_logits_to_fp16_rounding(ggufs, variant):
    """The converter writes A as -exp(A_log) ([heads, 1]), D [heads, 1], the gated norm
    [groups, width / groups], the taps [channels, kernel], q and k permuted for its RoPE kernel
    (NoPE layers too), a dense model's shared MLP as ffn_gate/up/down and a sparse one's as the
    shared expert (ffn_*_shexp)."""
    folder, gguf = ggufs[variant]
    prompts = parity_prompts(transformers.AutoTokenizer.from_pretrained(folder))
    reference = as_the_file_holds_it(load_hf_model(folder))
    for ours, theirs in zip(engine_logits(gguf, prompts), hf_logits(reference, prompts),
                            strict=True):
        torch.testing.assert_close(ours, theirs, atol=1e-4, rtol=1e-4)


@torch.no_grad()
def as_the_file_holds_it(model):
    """The folder's model with each matrix and 3-D expert tensor rounded as llama.cpp's f16
    file holds it, but the routers and the convolutions' taps, which the converter keeps in
    fp32 (as it does norms and vectors)."""
    for name, parameter in model.named_parameters():
        if parameter.ndim >= 2 and not name.endswith(("router.weight", "conv1d.weight")):
            parameter.copy_(parameter.half().float())
    return model


@pytest.mark.parametrize("variant", ["granite-hybrid", "granite-hybrid-moe"])
def test_granite_gguf_greedy_tokens_equal_llama_cpps(ggufs, variant):
    record, = llama_cpp_records("tiny_hybrid.json", family=variant, type="f16")
    assert not greedy_disagreements_with_llama_cpp(ggufs[variant][1], record)


@pytest.mark.parametrize("variant", ["granite-hybrid", "granite-hybrid-moe"])
def test_granite_q4_k_m_greedy_tokens_equal_llama_cpps(ggufs, variant, tmp_path):
    """llama-quantize's Q4_K_M (rows 64 wide: Q5_0 and Q8_0), where a build is at hand."""
    q4 = quantize_with_llama_cpp(ggufs[variant][1], tmp_path / f"tiny-{variant}.Q4_K_M.gguf")
    record, = llama_cpp_records("tiny_hybrid.json", family=variant, type="Q4_K_M")
    assert not greedy_disagreements_with_llama_cpp(q4, record, LLAMA_CPP_QUANTIZED_NEAR_TIE)


@pytest.mark.parametrize("variant", ["granite-hybrid", "granite-hybrid-moe"])
def test_granite_gguf_config_states_what_the_folders_does(ggufs, variant):
    folder, gguf = ggufs[variant]
    want = architecture(transformers.AutoConfig.from_pretrained(folder))
    got = architecture(config_from_gguf(GGUFModelFile(gguf)))
    # The file states no scan chunk (a GPU tile; on a CPU the decoder takes its own).
    mamba = replace(want.layers[0], chunk_size=got.layers[0].chunk_size)
    assert got.layers == tuple(mamba if isinstance(kind, Mamba2Kind) else kind
                               for kind in want.layers)
    assert got.ropes == want.ropes
    assert got.moe == want.moe
    for scalar in ("embedding_scale", "residual_scale", "logit_divisor", "attention_scale"):
        assert getattr(got, scalar) == pytest.approx(getattr(want, scalar)), scalar  # float32
    assert (got.tied_embeddings, got.qkv_bias) == (want.tied_embeddings, want.qkv_bias)
    assert got.shape.recurrent_layers == want.shape.recurrent_layers
    assert got.shape.intermediate_size == want.shape.intermediate_size


def test_granite_gguf_chat_template_and_tokens_are_the_files(ggufs, tmp_path):
    folder, gguf = ggufs["granite-hybrid"]
    assert_gguf_tokenizer_is_the_folders(gguf, folder, tmp_path)


_GRANITE_KEYS = {"granitehybrid.embedding_length": 64, "granitehybrid.attention.head_count": 4,
                 "granitehybrid.block_count": 3, "granitehybrid.feed_forward_length": 32,
                 "granitehybrid.context_length": 4096,
                 "granitehybrid.attention.head_count_kv": [0, 2, 0],
                 "granitehybrid.expert_shared_feed_forward_length": 96,
                 "granitehybrid.ssm.conv_kernel": 4, "granitehybrid.ssm.state_size": 16,
                 "granitehybrid.ssm.group_count": 2, "granitehybrid.ssm.inner_size": 128,
                 "granitehybrid.ssm.time_step_rank": 8}


@pytest.mark.parametrize(("keys", "what"), [
    ({"granitehybrid.attention.head_count_kv": 2}, "head_count_kv"),
    ({"granitehybrid.attention.head_count_kv": [0, 2, 4]}, "head_count_kv"),
    ({"granitehybrid.ssm.time_step_rank": 6}, "ssm.inner_size"),
    ({"granitehybrid.ssm.inner_size": 96}, "ssm.inner_size"),
    ({"granitehybrid.rope.scaling.finetuned": "no"}, "finetuned"),
    ({"granitehybrid.rope.dimension_count": 8}, "Bamba"),  # 8 of 16: partial rotary
])
def test_a_granite_file_with_damaged_keys_is_refused(keys, what):
    with pytest.raises(ModelLoadError, match=what):
        config_from_gguf(FakeGGUFSettings("granitehybrid", _GRANITE_KEYS | keys, {}))


def test_a_dense_granite_file_without_a_shared_width_takes_the_mlps():
    keys = dict(_GRANITE_KEYS)
    del keys["granitehybrid.expert_shared_feed_forward_length"]
    config = config_from_gguf(FakeGGUFSettings("granitehybrid", keys, {}))
    assert config.shared_intermediate_size == 32


def test_a_granite_file_that_does_not_say_rope_is_off_rotates():
    """llama.cpp's rule: a Granite file without rope.scaling.finetuned uses RoPE."""
    config = config_from_gguf(FakeGGUFSettings("granitehybrid", _GRANITE_KEYS, {}))
    assert config.position_embedding_type == "rope"
    off = _GRANITE_KEYS | {"granitehybrid.rope.scaling.finetuned": False}
    config = config_from_gguf(FakeGGUFSettings("granitehybrid", off, {}))
    assert config.position_embedding_type == "nope"
