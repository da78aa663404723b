"""The fit check sizes a model's KV cache from its headers as its layers hold it: a Gemma-3-shaped
model (five windowed layers per global one) counts a windowed layer's window and one block, not
the whole context, read without its tokenizer or weights."""

from dataclasses import replace

import gguf
import numpy as np
import pytest
from tiny_gguf import HEAD_DIM as TINY_HEAD_DIM
from tiny_gguf import KV_HEADS as TINY_KV_HEADS
from tiny_gguf import LAYERS as TINY_LAYERS
from tiny_gguf import write_tiny_gguf

from pagoda.engine.config import EngineConfig
from pagoda.engine.errors import ModelLoadError
from pagoda.engine.llm_engine import LLMEngine
from pagoda.engine.loading.gguf_names import gguf_tensor_name, needed_layer_modules
from pagoda.engine.loading.model_info import (
    MEMORY_OVERHEAD_BYTES,
    check_model_fits,
    describe_headers,
    read_model_headers,
)
from pagoda.engine.models.architecture import FULL_ATTENTION, ModelShape
from pagoda.engine.models.kv_cache_sizing import (
    AUTO_KV_CACHE_LIMIT,
    WINDOWED_SEQUENCES,
    model_kv_cache_bytes,
)

LAYERS, KV_HEADS, HEAD_DIM = 6, 1, 32
CONTEXT, WINDOW, BLOCK = 4096, 64, 16
GEMMA3_WINDOWS = (WINDOW,) * 5 + (FULL_ATTENTION,)
FP32_KEY_AND_VALUE = 2 * KV_HEADS * HEAD_DIM * 4  # bytes per layer and token
CHUNK = EngineConfig(block_size=BLOCK).max_num_batched_tokens
# The pools the engine allocates: the global layer's two whole contexts; the five windowed
# layers' window and one block for each of WINDOWED_SEQUENCES sequences, and a prefill chunk.
GEMMA3_POOLS = (2 * CONTEXT + 5 * (WINDOWED_SEQUENCES * (WINDOW + BLOCK) + CHUNK + BLOCK)) * \
    FP32_KEY_AND_VALUE
GEMMA3_SHAPE = ModelShape(num_layers=LAYERS, hidden_size=64, num_heads=2, num_kv_heads=KV_HEADS,
                          head_dim=HEAD_DIM, vocab_size=32, rms_norm_eps=2 ** -20,
                          max_position_embeddings=CONTEXT, intermediate_size=128,
                          layer_windows=GEMMA3_WINDOWS)


@pytest.fixture(scope="module")
def gemma3_header(tmp_path_factory):
    """Keys as llama.cpp's converter writes a Gemma 3 file's (the layer pattern left to
    llama.cpp's default of 6), every tensor a layer needs present but tiny: only the header is
    read."""
    path = tmp_path_factory.mktemp("gemma3") / "tiny-gemma3.gguf"
    writer = gguf.GGUFWriter(path, "gemma3")
    writer.add_block_count(LAYERS)
    writer.add_context_length(CONTEXT)
    writer.add_embedding_length(GEMMA3_SHAPE.hidden_size)
    writer.add_feed_forward_length(GEMMA3_SHAPE.intermediate_size)
    writer.add_head_count(GEMMA3_SHAPE.num_heads)
    writer.add_head_count_kv(KV_HEADS)
    writer.add_key_length(HEAD_DIM)
    writer.add_value_length(HEAD_DIM)
    writer.add_layer_norm_rms_eps(GEMMA3_SHAPE.rms_norm_eps)
    writer.add_sliding_window(WINDOW)
    writer.add_tensor("token_embd.weight",
                      np.zeros((GEMMA3_SHAPE.vocab_size, GEMMA3_SHAPE.hidden_size), np.float32))
    names = ["model.norm.weight", *(f"model.layers.{i}.{module}.weight" for i in range(LAYERS)
                                    for module in needed_layer_modules("gemma3"))]
    for name in names:
        writer.add_tensor(gguf_tensor_name(name, "gemma3"), np.ones(4, np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def test_a_gemma3_files_shape_and_layer_windows_are_read_from_its_keys(gemma3_header):
    assert read_model_headers(gemma3_header).shape == GEMMA3_SHAPE


def test_the_fit_check_of_a_gemma3_file_counts_its_windowed_kv_cache(gemma3_header):
    config = EngineConfig(block_size=BLOCK)
    weights = describe_headers(read_model_headers(gemma3_header)).weight_bytes
    needed = weights + GEMMA3_POOLS + MEMORY_OVERHEAD_BYTES

    check_model_fits(gemma3_header, config, available=needed)
    with pytest.raises(ModelLoadError, match="needs about"):
        check_model_fits(gemma3_header, config, available=needed - 1)


def test_the_kv_estimate_of_a_gemma3_shape_counts_the_pools_its_layers_get():
    assert model_kv_cache_bytes(GEMMA3_SHAPE, EngineConfig(block_size=BLOCK)) == GEMMA3_POOLS


def test_a_gemma3_shape_at_32k_tokens_asks_for_under_0_3x_of_every_layer_global():
    shape = replace(GEMMA3_SHAPE, max_position_embeddings=32768,
                    layer_windows=(512,) * 5 + (FULL_ATTENTION,))
    all_global = replace(shape, layer_windows=(FULL_ATTENTION,) * LAYERS)
    config = EngineConfig(block_size=BLOCK)
    assert model_kv_cache_bytes(shape, config) <= 0.3 * model_kv_cache_bytes(all_global, config)


def test_the_context_setting_and_the_byte_settings_bound_the_estimate():
    short = model_kv_cache_bytes(GEMMA3_SHAPE, EngineConfig(block_size=BLOCK, max_model_len=32))

    assert short == 2 * LAYERS * 32 * FP32_KEY_AND_VALUE
    assert model_kv_cache_bytes(GEMMA3_SHAPE, EngineConfig(kv_cache_memory=12345)) == 12345
    assert model_kv_cache_bytes(None, EngineConfig()) == AUTO_KV_CACHE_LIMIT


def test_the_fit_check_asks_for_the_weights_the_models_kv_cache_and_the_overhead(tmp_path):
    path = write_tiny_gguf(tmp_path / "tiny.gguf").path  # every layer global, 512 positions
    config = EngineConfig()
    headers = read_model_headers(path)
    kv = model_kv_cache_bytes(headers.shape, config)
    needed = describe_headers(headers).weight_bytes + kv + MEMORY_OVERHEAD_BYTES

    assert kv == 2 * TINY_LAYERS * 512 * 2 * TINY_KV_HEADS * TINY_HEAD_DIM * 4
    check_model_fits(path, config, available=needed)
    with pytest.raises(ModelLoadError, match="needs about"):
        check_model_fits(path, config, available=needed - 1)


def test_the_estimate_of_a_gemma3_folder_is_the_bytes_its_engine_allocates(tiny_gemma3_folder):
    """The tiny Gemma 3 under the automatic rule: the estimate from its config.json equals the
    pools the loaded engine holds."""
    folder = tiny_gemma3_folder
    config = EngineConfig(num_threads=1)
    estimate = model_kv_cache_bytes(read_model_headers(folder).shape, config)

    groups = LLMEngine(str(folder), config).runner.kv_cache_groups
    assert [group.window for group in groups] == [FULL_ATTENTION, 8]
    assert estimate == sum(group.num_blocks * group.bytes_per_block for group in groups)
