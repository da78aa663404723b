"""The context the window offers for the engine in this process (the context meter's figure, what
a chat is fitted to) is what its KV cache can hold for one chat: the allowed context within the
blocks of the group that keeps every block (the full-attention layers). A Gemma-3-shaped model,
whose five windowed layers of six keep only their windows, reaches further at the same memory
than the same model with every layer global."""

import json
import shutil

import pytest

from pagoda.app.backends.chat.local import LocalBackend
from pagoda.engine import LLM, SamplingParams
from pagoda.engine.async_engine import AsyncEngine
from pagoda.engine.config import EngineConfig
from pagoda.engine.errors import PromptTooLongError
from pagoda.engine.llm_engine import LLMEngine

BLOCK = 16
# Between the all-global model's pool at its 512 positions (1.5 MiB) and the windowed one's
# (0.7 MiB): neither holds a whole context of 512 tokens, so the KV cache decides.
KV_CACHE_MEMORY = 516 << 10
ENGINE = EngineConfig(num_threads=1, block_size=BLOCK, max_num_batched_tokens=64,
                      kv_cache_memory=KV_CACHE_MEMORY)


@pytest.fixture(scope="module")
def gemma3_folders(tiny_gemma3_folder, tmp_path_factory):
    """The tiny Gemma 3 (layers 0-4 windowed to 8 keys, layer 5 global), and a copy whose
    layers are all global."""
    windowed = tiny_gemma3_folder
    all_global = tmp_path_factory.mktemp("gemma3-global") / "model"
    shutil.copytree(windowed, all_global)
    config = json.loads((all_global / "config.json").read_text())
    config["layer_types"] = ["full_attention"] * config["num_hidden_layers"]
    (all_global / "config.json").write_text(json.dumps(config))
    return windowed, all_global


@pytest.fixture(scope="module")
def engines(gemma3_folders):
    return tuple(LLMEngine(str(folder), ENGINE) for folder in gemma3_folders)


def _offered_context(engine: LLMEngine) -> int:
    backend = LocalBackend(AsyncEngine(engine=engine))
    try:
        return backend.max_model_len
    finally:
        backend.shutdown()


def test_the_context_offered_is_what_the_full_attention_layers_blocks_hold(engines):
    for engine in engines:
        held = engine.runner.kv_cache_groups[0].num_blocks * BLOCK
        assert held < engine.max_model_len
        assert _offered_context(engine) == held


def test_a_windowed_model_is_offered_a_longer_context_at_the_same_memory(engines):
    windowed, all_global = map(_offered_context, engines)
    assert windowed > all_global


def test_a_prompt_filling_the_offered_context_runs_and_one_token_more_is_refused(engines):
    engine = engines[0]  # the windowed model
    context = _offered_context(engine)
    llm = LLM.from_engine(engine)
    reply = SamplingParams(temperature=0, max_tokens=1, ignore_eos=True)

    out, = llm.generate([7] * (context - 1), reply)
    assert len(out.outputs[0].token_ids) == 1
    with pytest.raises(PromptTooLongError, match="KV cache holds"):
        llm.generate([7] * context, reply)
