"""Whether a model on the Hub fits this machine's memory, before it is downloaded: the loader's
estimate (pagoda.engine.loading.model_info) applied to the Hub's parameter count or the file's size."""

import json
import sys
from dataclasses import replace

import pytest
from fake_hub import FakeHub, FakeRepo, served, use_hub

from pagoda.engine.config import EngineConfig
from pagoda.engine.hub.fit import estimate_fit, file_fit, folder_fit, kv_cache_bytes, parameters_from_size
from pagoda.engine.hub.search import HubFile, HubRepo, repo_config, repo_info
from pagoda.engine.loading.model_info import (
    INT4_BYTES_PER_ELEMENT,
    INT8_BYTES_PER_ELEMENT,
    MEMORY_OVERHEAD_BYTES,
    total_memory,
)
from pagoda.engine.models.architecture import FULL_ATTENTION, ModelShape
from pagoda.engine.models.kv_cache_sizing import AUTO_KV_CACHE_LIMIT, model_kv_cache_bytes

GIB = 1 << 30
KV = 1 << 30
B7 = 7_600_000_000  # Qwen2.5-7B
B05 = 494_000_000  # Qwen2.5-0.5B
GGUF_REPO = "pagoda-test/counted-GGUF"
FOLDER_REPO = "pagoda-test/counted-llama"
GEMMA_REPO = "pagoda-test/gemma-shaped-GGUF"
# Gemma 3 270M's layers, six of them (five windowed to 512 keys, one global), at 32k positions.
GEMMA3_CONFIG = {"model_type": "gemma3_text", "num_hidden_layers": 6, "hidden_size": 640,
                 "num_attention_heads": 4, "num_key_value_heads": 1, "head_dim": 256,
                 "intermediate_size": 2048, "vocab_size": 262144, "sliding_window": 512,
                 "max_position_embeddings": 32768, "rms_norm_eps": 1e-6}
GEMMA3_SHAPE = ModelShape(num_layers=6, hidden_size=640, num_heads=4, num_kv_heads=1,
                          head_dim=256, vocab_size=262144, rms_norm_eps=1e-6,
                          max_position_embeddings=32768, intermediate_size=2048,
                          layer_windows=(512,) * 5 + (FULL_ATTENTION,))
# A Q6_K block: 256 weights in 210 bytes, kept as the file stores them on CPU.
Q6_K_BYTES_PER_ELEMENT = 210 / 256


def test_a_7b_q8_0_file_is_too_big_for_8_gib():
    fit = estimate_fit("Q8_0", 8_100_000_000, B7, "gguf", KV, available=6 * GIB, total=8 * GIB)

    assert fit.verdict == "too_big"
    assert fit.needed_bytes > 8 * GIB


def test_a_7b_q4_k_m_file_on_8_gib_with_little_free_is_tight():
    fit = estimate_fit("Q4_K_M", 4_680_000_000, B7, "gguf", KV, available=3 * GIB,
                       total=8 * GIB)

    assert fit.verdict == "tight"
    assert fit.available_bytes < fit.needed_bytes <= fit.total_bytes


def test_a_half_billion_model_fits_16_gib():
    fit = estimate_fit("BF16", 988_000_000, B05, "safetensors", KV, available=12 * GIB,
                       total=16 * GIB)

    assert fit.verdict == "fits"


def test_the_verdict_is_unknown_when_memory_cannot_be_measured(monkeypatch):
    monkeypatch.setattr("pagoda.engine.hub.fit.available_memory", lambda: None)
    monkeypatch.setattr("pagoda.engine.hub.fit.total_memory", lambda: None)

    fit = estimate_fit("Q4_K_M", 400_000_000, B05, "gguf", KV)

    assert (fit.verdict, fit.available_bytes, fit.total_bytes) == ("unknown", None, None)


def test_memory_is_measured_when_not_given():
    fit = estimate_fit("Q4_K_M", 400_000_000, B05, "gguf", KV)

    assert fit.total_bytes == total_memory() > 0 and fit.available_bytes > 0


def test_total_memory_without_psutil_reads_meminfo(monkeypatch):
    measured = total_memory()
    monkeypatch.setitem(sys.modules, "psutil", None)  # import psutil now raises ImportError

    assert total_memory() == pytest.approx(measured, rel=0.01)


@pytest.mark.parametrize(("quantization", "model_format", "setting", "bytes_per_parameter"), [
    ("Q4_K_M", "gguf", "auto", INT4_BYTES_PER_ELEMENT),
    ("Q4_0", "gguf", "auto", INT4_BYTES_PER_ELEMENT),
    ("Q8_0", "gguf", "auto", INT8_BYTES_PER_ELEMENT),
    ("Q6_K", "gguf", "auto", Q6_K_BYTES_PER_ELEMENT),  # its own blocks, read in place
    ("F16", "gguf", "auto", 4),
    ("BF16", "safetensors", "auto", 4),
    ("BF16", "safetensors", "int4", INT4_BYTES_PER_ELEMENT),
    ("Q4_K_M", "gguf", "none", 4),
])
def test_weights_are_priced_in_the_layout_the_loader_keeps(quantization, model_format, setting,
                                                           bytes_per_parameter):
    fit = estimate_fit(quantization, 1, B7, model_format, KV, available=GIB, total=GIB,
                       quantization=setting)

    assert fit.weight_bytes == pytest.approx(B7 * bytes_per_parameter, rel=1e-6)
    assert fit.needed_bytes == fit.weight_bytes + KV + MEMORY_OVERHEAD_BYTES


def test_a_q4_k_m_files_bytes_beyond_4_5_bits_per_weight_are_priced_as_q6_k_blocks():
    size = 4_683_073_952  # Qwen2.5-7B-Instruct-Q4_K_M.gguf
    in_q6_k = (size - B7 * 144 / 256) / (210 / 256 - 144 / 256)

    fit = estimate_fit("Q4_K_M", size, B7, "gguf", KV, available=GIB, total=GIB)

    expected = (B7 - in_q6_k) * INT4_BYTES_PER_ELEMENT + in_q6_k * Q6_K_BYTES_PER_ELEMENT
    assert fit.weight_bytes == pytest.approx(expected, rel=1e-6)


def test_without_the_hubs_count_parameters_come_from_the_size_and_bits_per_weight():
    assert parameters_from_size(34 * 1000, "Q8_0") == 32 * 1000  # 8.5 bits
    assert parameters_from_size(144 * 1000, "Q4_K") == 256 * 1000  # 4.5 bits
    assert parameters_from_size(2 * 1000, "BF16") == 1000

    fit = estimate_fit("Q8_0", 34 * 1000, None, "gguf", KV, available=GIB, total=GIB)

    assert fit.num_parameters == 32 * 1000


def test_a_file_of_unknown_quantization_is_taken_at_its_size():
    fit = estimate_fit(None, 5_000_000, B05, "gguf", KV, available=GIB, total=GIB)

    assert (fit.weight_bytes, fit.num_parameters) == (5_000_000, None)


@pytest.fixture(scope="module")
def fake_hub():
    hub = FakeHub()
    hub.add(FakeRepo(GGUF_REPO, ["gguf", "llama"], {"m-Q8_0.gguf": b"GGUF" * 100},
                     architecture="llama", num_parameters=B05))
    hub.add(FakeRepo(FOLDER_REPO, ["safetensors", "llama"],
                     {"config.json": b"{}", "model.safetensors": b"\0" * 4000,
                      "tokenizer.json": b"{}"},
                     model_type="llama", num_parameters=B7, safetensors_dtype="BF16"))
    hub.add(FakeRepo(GEMMA_REPO, ["gguf", "gemma3"],
                     {"config.json": json.dumps(GEMMA3_CONFIG).encode(),
                      "gemma-Q4_K_M.gguf": b"GGUF" * 100},
                     architecture="gemma3", num_parameters=B05))
    with served(hub):
        yield hub


@pytest.fixture
def hub(fake_hub, monkeypatch, tmp_path) -> FakeHub:
    return use_hub(fake_hub, monkeypatch, tmp_path, 1 << 16)


def test_the_hubs_parameter_count_comes_with_the_listing(hub):
    gguf, folder = repo_info(GGUF_REPO), repo_info(FOLDER_REPO)

    assert gguf.num_parameters == B05 and gguf.model_type is None
    assert (folder.num_parameters, folder.weights_dtype, folder.model_type) == (B7, "BF16",
                                                                                 "llama")


def test_a_listed_file_and_folder_are_priced_from_the_hubs_count(hub):
    gguf, folder = repo_info(GGUF_REPO), repo_info(FOLDER_REPO)

    file = file_fit(gguf, gguf.files[0], KV, available=16 * GIB, total=16 * GIB)
    whole = folder_fit(folder, KV, available=16 * GIB, total=16 * GIB)

    assert (file.num_parameters, file.verdict) == (B05, "fits")
    assert file.weight_bytes == pytest.approx(B05 * INT8_BYTES_PER_ELEMENT, rel=1e-6)
    assert (whole.num_parameters, whole.verdict) == (B7, "too_big")  # 7.6 B in fp32
    assert whole.weight_bytes == pytest.approx(B7 * 4, rel=1e-6)


def test_a_repository_without_a_folder_has_no_folder_fit():
    repo = HubRepo("o/gguf", "c0ffee", [HubFile("m-Q4_K_M.gguf", 10, None, None, "Q4_K_M")])

    assert folder_fit(repo, KV) is None


def test_a_repositorys_config_json_comes_as_its_settings(hub):
    assert repo_config(repo_info(GEMMA_REPO)) == GEMMA3_CONFIG
    assert repo_config(repo_info(GGUF_REPO)) is None  # it has none


def test_the_kv_cache_of_a_gemma3_shaped_config_counts_its_windowed_layers_windows():
    config = EngineConfig()
    all_global = replace(GEMMA3_SHAPE, layer_windows=(FULL_ATTENTION,) * 6)

    assert kv_cache_bytes(GEMMA3_CONFIG, config) == model_kv_cache_bytes(GEMMA3_SHAPE, config)
    assert kv_cache_bytes(GEMMA3_CONFIG, config) < 0.3 * model_kv_cache_bytes(all_global, config)


@pytest.mark.parametrize("config_json", [None, {}, {"model_type": "deepseek_v3"}, [1]])
def test_without_a_config_pagoda_reads_the_kv_cache_is_the_cap(config_json):
    assert kv_cache_bytes(config_json, EngineConfig()) == AUTO_KV_CACHE_LIMIT
