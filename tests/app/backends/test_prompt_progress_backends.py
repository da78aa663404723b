"""Each backend reports how far a long prompt is read before its reply begins: the engine in
this process, Pagoda's server over it, and llama.cpp; vLLM is not asked (it cannot tell)."""

import json

import pytest
from conftest import ENGINE, SERVED_NAME, remote, run

from pagoda.app.backends import ChatMessage, PromptProgress, ReplyChunk, SamplingOptions
from pagoda.app.backends.chat.local import LocalBackend
from pagoda.app.backends.remote.openai_stream import ReplyReader

CHUNK = 32


def long_chat(word: str) -> list[ChatMessage]:
    """About 200 tokens, none of them in the prefix cache yet (one `word` per test)."""
    return [ChatMessage("user", f"{word}: read this twice. " * 40)]

GREEDY = SamplingOptions(temperature=0.0, max_tokens=3)


@pytest.fixture(scope="module")
def chunked_engine(make_engine):
    from pagoda.engine.async_engine import AsyncEngine

    engine = AsyncEngine(engine=make_engine(**ENGINE, max_num_batched_tokens=CHUNK))
    yield engine
    engine.shutdown()


@pytest.fixture(scope="module")
def chunked_server(chunked_engine):
    from pagoda.engine.server.api import build_app
    from pagoda.engine.server.runner import ServerThread
    from pagoda.engine.server.served import ServedModel

    served = ServedModel(SERVED_NAME, chunked_engine, chunked_engine.engine.max_model_len)
    server = ServerThread(build_app(lambda: served)).start()
    yield server
    server.stop()


async def _chunks(backend, messages, options=GREEDY) -> list[ReplyChunk]:
    return [chunk async for chunk in backend.stream(messages, options)]


def assert_progress_then_text(chunks: list[ReplyChunk]) -> list[PromptProgress]:
    first_text = next(i for i, c in enumerate(chunks) if c.delta_text)
    progress = [c.prompt_progress for c in chunks[:first_text] if c.prompt_progress]
    assert progress, "no progress before the reply"
    assert all(c.prompt_progress is None for c in chunks[first_text:])
    assert all(c.delta_text == "" for c in chunks[:first_text])
    done = [p.num_computed_tokens for p in progress]
    assert done == sorted(done) and all(d <= p.num_prompt_tokens for d, p in zip(done, progress))
    return progress


def test_the_local_engine_reports_each_chunk_of_a_long_prompt(chunked_engine):
    backend = LocalBackend(chunked_engine)
    chunks = run(_chunks(backend, long_chat("Local")))

    progress = assert_progress_then_text(chunks)
    assert [p.num_computed_tokens for p in progress][:2] == [CHUNK, 2 * CHUNK]
    assert chunks[-1].num_prompt_tokens == progress[0].num_prompt_tokens


def test_pagodas_server_reports_the_reading_to_the_remote_backend(chunked_server):
    backend = remote(f"{chunked_server.url}/v1")
    chunks = run(_chunks(backend, long_chat("Remote")))

    assert backend.flavor == "pagoda"
    progress = assert_progress_then_text(chunks)
    assert len(progress) >= 3
    assert chunks[-1].num_prompt_tokens == progress[0].num_prompt_tokens


def test_llama_cpp_is_asked_for_its_progress_and_its_chunks_are_read(fake_llama_cpp):
    fake, url = fake_llama_cpp
    chunks = run(_chunks(remote(url), [ChatMessage("user", "x" * 400)]))

    assert fake.requests[-1]["return_progress"] is True
    progress = assert_progress_then_text(chunks)
    assert progress == [PromptProgress(52, 104), PromptProgress(104, 104)]


def test_vllm_is_not_asked_for_progress(fake_vllm):
    fake, url = fake_vllm
    chunks = run(_chunks(remote(url), long_chat("vLLM")))

    assert "return_progress" not in fake.requests[-1]
    assert all(c.prompt_progress is None for c in chunks)


@pytest.mark.parametrize("progress", [
    None, "half", {"total": 0, "processed": 0}, {"total": 10}, {"total": "10", "processed": 5},
    {"total": 10, "processed": True},
])
def test_progress_that_is_not_llama_cpps_shape_is_ignored(progress):
    reader = ReplyReader("http://server/v1", 0.0)
    data = {"choices": [{"index": 0, "delta": {}}], "prompt_progress": progress}

    assert reader.read(_json(data)) is None


def test_progress_past_the_total_reads_as_all_of_it():
    reader = ReplyReader("http://server/v1", 0.0)
    chunk = reader.read(_json({"choices": [], "prompt_progress": {"total": 10,
                                                                  "processed": 12}}))

    assert chunk.prompt_progress == PromptProgress(10, 10)


def test_progress_after_the_reply_began_is_ignored():
    reader = ReplyReader("http://server/v1", 0.0)
    reader.read(_json({"choices": [{"index": 0, "delta": {"content": "Hi"}}]}))

    late = reader.read(_json({"choices": [], "prompt_progress": {"total": 9, "processed": 9}}))

    assert late is None


def _json(payload) -> str:
    return json.dumps(payload)
