"""The engine thread builds the engine and runs all of its torch work: nothing else may, or two
OpenMP thread teams share the cores (see pagoda/engine/async_engine.py)."""

import asyncio

import pytest
from tiny_gguf import QType, write_tiny_gguf
from torch_threads import torch_callers

from pagoda.engine import AsyncEngine, EngineConfig, LLMEngine, SamplingParams
from pagoda.engine.errors import PagodaError
from pagoda.engine.sampling.params import StructuredOutputsParams

CONFIG = EngineConfig(num_kv_blocks=16)


@pytest.fixture(scope="module")
def int4_file(tmp_path_factory):
    """A Q4_0 file: its matrices load as packed int4, whose kernel path is measured at load."""
    return write_tiny_gguf(tmp_path_factory.mktemp("gguf") / "tiny.gguf",
                           matrix_type=QType.Q4_0).path


def _chat(engine: AsyncEngine, params: SamplingParams | None = None) -> list[int]:
    async def reply() -> list[int]:
        async for out in engine.stream([{"role": "user", "content": "hello"}],
                                       params or SamplingParams(temperature=0, max_tokens=4)):
            pass
        return out.outputs[0].token_ids

    return asyncio.run(reply())


def test_only_the_engine_thread_runs_torch_from_load_to_reply(int4_file):
    with torch_callers() as callers:
        engine = AsyncEngine(int4_file, CONFIG)
        tokens = _chat(engine)
        engine.shutdown()
    assert len(tokens) == 4
    assert callers.threads == {"pagoda-engine"}, callers.examples


def test_a_constrained_request_compiles_off_the_engine_thread_without_torch(int4_file):
    """The grammar thread compiles; the bitmask and the logprobs are the engine thread's."""
    constrained = SamplingParams(temperature=0, max_tokens=4, logprobs=2,
                                 structured_outputs=StructuredOutputsParams(regex="[a-z]{4}"))
    with torch_callers() as callers:
        engine = AsyncEngine(int4_file, CONFIG)
        tokens = _chat(engine, constrained)
        engine.shutdown()
    assert tokens
    assert callers.threads == {"pagoda-engine"}, callers.examples


def test_an_engine_built_by_the_caller_shows_as_torch_work_on_two_threads(int4_file):
    """The check above can fail: adopting an engine built on the caller's thread is seen."""
    with torch_callers() as callers:
        engine = AsyncEngine(engine=LLMEngine(str(int4_file), CONFIG))
        _chat(engine)
        engine.shutdown()
    assert callers.threads == {"MainThread", "pagoda-engine"}


def test_a_build_that_fails_raises_its_error_on_the_callers_thread(tmp_path):
    missing = tmp_path / "missing.gguf"
    with pytest.raises(PagodaError, match="missing.gguf"):
        AsyncEngine(missing, CONFIG)


def test_build_runs_on_the_engine_thread_and_its_engine_serves(int4_file):
    import threading

    built_on = []

    def build() -> LLMEngine:
        built_on.append(threading.current_thread().name)
        return LLMEngine(str(int4_file), CONFIG)

    engine = AsyncEngine(build=build)
    try:
        assert built_on == ["pagoda-engine"] and len(_chat(engine)) == 4
    finally:
        engine.shutdown()


def test_engine_and_build_together_are_refused(int4_file):
    with pytest.raises(ValueError, match="not both"):
        AsyncEngine(engine=object(), build=lambda: None)
