"""Gemma 4 (text, dense) runs as transformers defines it, from a model folder and from the GGUF
llama.cpp's converter writes of it.

The tiny model (tests/engine/tiny_models.py, "gemma4") windows layers 0, 1, 3 and 4 to 8 keys
(head size 32, two KV heads) and keeps layers 2 and 5 global with their own head size (96), one
KV head whose values are its keys' projection, and "proportional" RoPE over a quarter of their
pairs; its layer scalars and norms are random, so a model that skips one fails parity.
"gemma4-e2b" is built as the E2B: per-layer embeddings, and its last two layers read the KV
caches of layers 2 and 3 (MLPs twice as wide there).
"""

import json
import re
import shutil
from dataclasses import replace
from pathlib import Path

import pytest
import torch
import transformers
from safetensors.torch import load_file, save_file
from tiny_models import tiny_config

from pagoda.engine import LLM, SamplingParams
from pagoda.engine.config import EngineConfig
from pagoda.engine.errors import ModelLoadError
from pagoda.engine.hub.search import HubRepo
from pagoda.engine.loading.gguf import GGUFModelFile
from pagoda.engine.loading.loader import load_model
from pagoda.engine.loading.model_info import read_model_headers
from pagoda.engine.models.gemma4 import architecture, config_from_gguf
from pagoda.engine.models.kv_cache_sizing import model_kv_cache_bytes
from pagoda.engine.models.native_decode import not_covered
from pagoda.engine.models.registry import architecture_of, family_for_gguf, family_for_model_type
from pagoda.engine.worker.model_runner import ModelRunner
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
from tests.engine.models.test_parity import NUM_THREADS, assert_greedy_parity, parity_prompts

pytestmark = pytest.mark.usefixtures("fresh_gguf_metadata_cache")

WINDOW = 8  # the tiny model's sliding_window
GLOBAL_LAYERS = (2, 5)
# (KV heads, head size) of the windowed and of the global layers
WINDOWED_HEADS, GLOBAL_HEADS = (2, 32), (1, 96)


VARIANTS = ("gemma4", "gemma4-e2b")


@pytest.fixture(scope="module")
def folder(llama_cpp_ggufs):
    return llama_cpp_ggufs["gemma4"][0]


@pytest.fixture(scope="module")
def gguf_file(llama_cpp_ggufs):
    return llama_cpp_ggufs["gemma4"][1]


@pytest.fixture(scope="module")
def prompts(folder) -> list[list[int]]:
    """The parity prompts in the tiny Gemma tokenizer both variants share."""
    ids = parity_prompts(transformers.AutoTokenizer.from_pretrained(folder))
    assert min(map(len, ids)) > WINDOW
    return ids


@pytest.fixture(scope="module", params=VARIANTS)
def variant(request, llama_cpp_ggufs) -> tuple[str, Path, Path]:
    """(variant, its HF folder, its f16 GGUF by llama.cpp's converter)."""
    return request.param, *llama_cpp_ggufs[request.param]


def test_gemma4_folder_predicts_transformers_next_token_at_every_position(variant, prompts):
    name, folder, _ = variant
    for i, (ours, theirs) in enumerate(zip(engine_logits(folder, prompts),
                                           hf_logits(load_hf_model(folder), prompts),
                                           strict=True)):
        assert_same_argmax(ours, theirs, f"{name} prompt {i}")
        torch.testing.assert_close(ours, theirs, atol=2e-4, rtol=1e-4)


def test_gemma4_greedy_through_chunked_prefill_and_decoding_past_the_window_matches_transformers(
        variant, prompts):
    """Decode steps too: the one-call C step does not run Gemma 4's layers (`not_covered`), so
    they run layer by layer."""
    _, folder, _ = variant
    llm = LLM(str(folder), num_kv_blocks=128, num_threads=NUM_THREADS,
              max_num_batched_tokens=16)
    assert llm.engine.runner.model.native_decode is None
    assert_greedy_parity(llm, load_hf_model(folder), prompts)


def test_gemma4_global_layers_keep_their_own_kv_shape_in_a_pool_of_their_own(folder):
    runner = ModelRunner(load_model(folder), EngineConfig(num_kv_blocks=16, num_threads=1))
    assert runner.kv_layout == [(0, GLOBAL_LAYERS), (WINDOW, (0, 1, 3, 4))]
    for i, (k_cache, v_cache) in enumerate(runner.kv_caches):
        heads = GLOBAL_HEADS if i in GLOBAL_LAYERS else WINDOWED_HEADS
        assert k_cache.shape[2:] == v_cache.shape[2:] == heads, i
    block = runner.block_size * 2 * 4  # keys and values, fp32
    assert [g.bytes_per_block for g in runner.kv_cache_groups] == [
        block * 2 * 96 * 1, block * 4 * 32 * 2]
    assert runner.bytes_per_block() == block * (2 * 96 + 4 * 64)


def test_gemma4_layers_that_share_kv_caches_read_their_owners_pool_and_hold_none(
        llama_cpp_ggufs):
    runner = ModelRunner(load_model(llama_cpp_ggufs["gemma4-e2b"][0]),
                         EngineConfig(num_kv_blocks=16, num_threads=1))
    assert runner.kv_layout == [(0, (3,)), (WINDOW, (0, 1, 2))]
    assert runner.kv_caches[4] is runner.kv_caches[2]
    assert runner.kv_caches[5] is runner.kv_caches[3]
    block = runner.block_size * 2 * 4
    assert runner.bytes_per_block() == block * (2 * 96 + 3 * 2 * 32)


def test_gemma4_e2b_prefix_cache_hits_give_the_tokens_of_a_cold_run(llama_cpp_ggufs, prompts):
    """A hit restores the blocks of the layers that own KV caches; the layers that share them
    read those, past their window too (the prompt runs past 8 tokens)."""
    llm = LLM(str(llama_cpp_ggufs["gemma4-e2b"][0]), num_kv_blocks=64, num_threads=1)
    params = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)
    prompt = prompts[4] + prompts[5]
    cold, = llm.generate([prompt], params)
    warm, = llm.generate([prompt], params)
    assert warm.num_cached_tokens >= 32
    assert warm.outputs[0].token_ids == cold.outputs[0].token_ids


def test_gemma4_memory_estimate_is_the_pools_the_engine_allocates(folder):
    """The fit check reads the shape from the headers alone: each layer at its own KV heads and
    head size, and the very pools a loaded engine then holds."""
    shape = read_model_headers(folder).shape
    assert shape.layer_heads == tuple(GLOBAL_HEADS if i in GLOBAL_LAYERS else WINDOWED_HEADS
                                      for i in range(6))
    config = EngineConfig(max_model_len=256, num_threads=1)
    runner = ModelRunner(load_model(folder), config)
    allocated = sum(g.num_blocks * g.bytes_per_block for g in runner.kv_cache_groups)
    assert model_kv_cache_bytes(shape, config) == allocated
    assert model_kv_cache_bytes(replace(shape, layer_heads=()), config) != allocated


def test_gemma4_one_call_decode_step_names_what_it_does_not_run(folder):
    reason = not_covered(architecture_of(transformers.AutoConfig.from_pretrained(folder)))
    for words in ("own head size", "keys' projection", "value norms", "layer output scalars"):
        assert words in reason


# The GGUF file llama.cpp's converter writes


def test_gemma4_gguf_gives_the_folders_logits_to_fp16_rounding(variant, prompts):
    _, folder, gguf_file = variant
    reference = round_matrices_to_fp16(load_hf_model(folder))
    for ours, theirs in zip(engine_logits(gguf_file, prompts), hf_logits(reference, prompts),
                            strict=True):
        torch.testing.assert_close(ours, theirs, atol=1e-4, rtol=1e-4)


def test_gemma4_gguf_config_runs_the_folders_architecture(variant):
    _, folder, gguf_file = variant
    want = architecture_of(transformers.AutoConfig.from_pretrained(folder))
    got = architecture(config_from_gguf(GGUFModelFile(gguf_file)))

    assert got.shape.rms_norm_eps == pytest.approx(want.shape.rms_norm_eps, rel=1e-7)
    assert got.shape.layer_windows == want.shape.layer_windows
    for field in ("layer_heads", "layer_kv_from", "layer_intermediate"):
        assert getattr(got.shape, field) == getattr(want.shape, field), field
    for field in ("layers", "ropes", "names", "attention_scale", "norm_offset", "activation",
                  "embedding_scale", "final_softcap", "tied_embeddings", "value_norm",
                  "per_layer_input"):
        assert getattr(got, field) == getattr(want, field), field


def test_gemma4_gguf_chat_template_and_tokens_are_the_files(gguf_file, folder, tmp_path):
    assert_gguf_tokenizer_is_the_folders(gguf_file, folder, tmp_path)


def test_gemma4_gguf_greedy_tokens_equal_llama_cpps(variant):
    name, _, gguf_file = variant
    record, = llama_cpp_records("tiny_families.json", family=name, type="f16")
    assert not greedy_disagreements_with_llama_cpp(gguf_file, record)


def test_gemma4_q4_k_m_greedy_tokens_equal_llama_cpps(variant, tmp_path):
    """llama-quantize's Q4_K_M of the tiny model (Q5_0 and Q8_0 at rows 64 wide), which we read
    exactly; llama.cpp also rounds activations to 8 bits, so its ties are wider."""
    name, _, gguf_file = variant
    q4 = quantize_with_llama_cpp(gguf_file, tmp_path / f"tiny-{name}.Q4_K_M.gguf")
    record, = llama_cpp_records("tiny_families.json", family=name, type="Q4_K_M")
    assert not greedy_disagreements_with_llama_cpp(q4, record, LLAMA_CPP_QUANTIZED_NEAR_TIE)


@pytest.fixture(scope="module")
def two_layer_folder(folder, tmp_path_factory) -> Path:
    """The tiny model cut to its layer 1 (windowed) and layer 2 (global): Triton's interpreter
    runs each kernel launch in Python, so every layer costs seconds."""
    cut = tmp_path_factory.mktemp("gemma4-two-layers")
    for file in folder.iterdir():
        if file.name != "model.safetensors":
            shutil.copy(file, cut)
    config = json.loads((cut / "config.json").read_text())
    config |= {"num_hidden_layers": 2, "layer_types": config["layer_types"][1:3],
               "per_layer_config": {"1": config["per_layer_config"]["2"]}}
    (cut / "config.json").write_text(json.dumps(config))
    tensors = load_file(folder / "model.safetensors")
    kept = {re.sub(r"layers\.([12])\.", lambda m: f"layers.{int(m[1]) - 1}.", name): tensor
            for name, tensor in tensors.items() if not re.search(r"layers\.[03-5]\.", name)}
    save_file(kept, cut / "model.safetensors", metadata={"format": "pt"})
    return cut


@pytest.mark.slow  # Triton's interpreter runs each kernel launch in Python: ~10 s here
def test_gemma4_on_the_triton_kernels_gives_the_torch_paths_greedy_tokens(two_layer_folder):
    """Two head sizes in one model, the value norm and the proportional rotary table on the
    Triton kernels, windowed and global layers in their own KV groups."""
    import tests.engine.test_triton_engine  # noqa: F401  (sets TRITON_INTERPRET without a GPU)

    def greedy(backend: str) -> list[list[int]]:
        llm = LLM(str(two_layer_folder), num_kv_blocks=32, num_threads=1, kernel_backend=backend,
                  max_num_batched_tokens=24)
        assert llm.engine.runner.model.ops.name == backend
        outputs = llm.generate([list(range(10, 40)), list(range(300, 311))],
                               SamplingParams(temperature=0, max_tokens=6, ignore_eos=True))
        return [o.outputs[0].token_ids for o in outputs]

    assert greedy("triton") == greedy("torch")


# What Pagoda does not run, said in words


@pytest.mark.parametrize(("settings", "words"), [
    ({"enable_moe_block": True, "num_experts": 4, "top_k_experts": 2,
      "moe_intermediate_size": 32}, "mixture-of-experts: not yet"),
    ({"hidden_size_per_layer_input": 16, "vocab_size_per_layer_input": 300},
     "cover 300 tokens"),
    ({"use_bidirectional_attention": "all"}, "both directions"),
])
def test_a_gemma4_config_pagoda_does_not_run_is_refused_with_the_reason(settings, words):
    config = tiny_config("gemma4", vocab_size=378)
    for key, value in settings.items():
        setattr(config, key, value)
    with pytest.raises(ModelLoadError, match=words):
        architecture(config)


def test_dense_gemma4_is_a_family_pagoda_runs_and_the_multimodal_folder_says_why_not():
    assert family_for_model_type("gemma4_text").name == "Gemma 4"
    assert family_for_gguf("gemma4").name == "Gemma 4"
    assert family_for_model_type("gemma4") is None
    # What the Hub search shows beside a repository
    assert HubRepo("google/gemma-4-E2B-it-GGUF", "c", [], architecture="gemma4").unsupported is None
    assert HubRepo("google/gemma-4-E2B", "c", [], model_type="gemma4_text").unsupported is None
    assert HubRepo("google/gemma-4-E2B-it", "c", [], model_type="gemma4").unsupported == (
        "vision-language model: not yet")


# A gemma4 file's settings as llama.cpp reads them


_GEMMA4_KEYS = {"gemma4.embedding_length": 64, "gemma4.attention.head_count": 4,
                "gemma4.attention.head_count_kv": [2, 2, 1, 2, 2, 1],
                "gemma4.attention.key_length": 64, "gemma4.attention.key_length_swa": 32,
                "gemma4.block_count": 6, "gemma4.feed_forward_length": 128,
                "gemma4.context_length": 4096, "gemma4.attention.sliding_window": 16,
                "gemma4.attention.sliding_window_pattern": [True, True, False] * 2,
                "gemma4.rope.freq_base": 1e6}


def settings_of(keys: dict, vectors: dict | None = None) -> FakeGGUFSettings:
    vectors = {"rope_freqs.weight": [1.0] * 8 + [1e30] * 24} if vectors is None else vectors
    return FakeGGUFSettings("gemma4", _GEMMA4_KEYS | keys, vectors)


def test_a_gemma4_file_global_layers_take_their_head_size_kv_heads_and_rotated_share():
    arch = architecture(config_from_gguf(settings_of({})))
    assert arch.shape.layer_heads == ((2, 32), (2, 32), (1, 64)) * 2
    assert arch.shape.layer_windows == (16, 16, 0) * 2
    full = dict(arch.ropes["full_attention"].parameters)
    assert full == {"rope_type": "proportional", "rope_theta": 1e6, "partial_rotary_factor": 0.25}
    assert arch.ropes["full_attention"].rotary_dim == 64  # the whole head, zero frequencies past
    assert dict(arch.ropes["sliding_attention"].parameters)["rope_theta"] == 10000.0
    assert all(kind.values_from_keys == (kind.window == 0) for kind in arch.layers)


@pytest.mark.parametrize(("keys", "vectors", "words"), [
    ({"gemma4.expert_count": 128}, None, "mixture-of-experts: not yet"),
    ({"gemma4.feed_forward_length": [128] * 5 + [256]}, None, "doubled on the layers that"),
    ({"gemma4.attention.sliding_window_pattern": [True, False]}, None, "one flag per layer"),
    ({"gemma4.attention.head_count_kv": [2, 1]}, None, "2 values"),
    ({}, {"rope_freqs.weight": [1e30] * 8 + [1.0] * 24}, "rope_freqs"),
    ({"gemma4.rope.scaling.type": "yarn"}, None, "scales RoPE by 'yarn'"),
])
def test_a_gemma4_file_pagoda_cannot_run_or_read_is_refused_in_words(keys, vectors, words):
    with pytest.raises(ModelLoadError, match=words):
        architecture(config_from_gguf(settings_of(keys, vectors)))
