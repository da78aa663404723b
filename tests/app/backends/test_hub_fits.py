"""The Models dialog's fit of a Hub file counts the KV cache the engine would allocate for that
model, sized from the repository's config.json: a Gemma-3-shaped model's windowed layers hold
their windows only, so it asks for less than the cap; a repository without one counts the cap."""

import json

import pytest

from pagoda.app.backends.services.hub import file_fits, repository
from pagoda.engine.config import EngineConfig
from pagoda.engine.hub.fit import kv_cache_bytes
from pagoda.engine.loading.model_info import MEMORY_OVERHEAD_BYTES
from pagoda.engine.models.kv_cache_sizing import AUTO_KV_CACHE_LIMIT
from tests.engine.fake_hub import FakeHub, FakeRepo, served, use_hub

WINDOWED_REPO, PLAIN_REPO = "pagoda-test/gemma-1b-shaped-GGUF", "pagoda-test/no-config-GGUF"
# Gemma 3 1B's layers: 26, each sixth global, the rest windowed to 512 keys, 32k positions.
GEMMA3_1B = {"model_type": "gemma3_text", "num_hidden_layers": 26, "hidden_size": 1152,
             "num_attention_heads": 4, "num_key_value_heads": 1, "head_dim": 256,
             "intermediate_size": 6912, "vocab_size": 262144, "sliding_window": 512,
             "max_position_embeddings": 32768, "rms_norm_eps": 1e-6}
GGUF_BYTES = b"GGUF" * 100


@pytest.fixture(scope="module")
def fake_hub():
    hub = FakeHub()
    hub.add(FakeRepo(WINDOWED_REPO, ["gguf", "gemma3"],
                     {"config.json": json.dumps(GEMMA3_1B).encode(), "m-Q8_0.gguf": GGUF_BYTES},
                     architecture="gemma3", num_parameters=1_000_000_000))
    hub.add(FakeRepo(PLAIN_REPO, ["gguf", "gemma3"], {"m-Q8_0.gguf": GGUF_BYTES},
                     architecture="gemma3", num_parameters=1_000_000_000))
    with served(hub):
        yield hub


@pytest.fixture
def hub(fake_hub, monkeypatch, tmp_path) -> FakeHub:
    return use_hub(fake_hub, monkeypatch, tmp_path, 1 << 16)


def _kv_bytes_counted(repo_id: str) -> int:
    (_, fit), = file_fits(repository(repo_id, None)).files
    return fit.needed_bytes - fit.weight_bytes - MEMORY_OVERHEAD_BYTES


def test_a_windowed_models_fit_counts_the_pools_its_engine_would_allocate(hub):
    counted = _kv_bytes_counted(WINDOWED_REPO)

    # kv_cache_bytes: the engine's estimate from a config.json (tests/engine/hub/test_hub_fit.py)
    assert counted == kv_cache_bytes(GEMMA3_1B, EngineConfig()) < AUTO_KV_CACHE_LIMIT


def test_a_repository_without_a_config_counts_the_cap(hub):
    assert _kv_bytes_counted(PLAIN_REPO) == AUTO_KV_CACHE_LIMIT
