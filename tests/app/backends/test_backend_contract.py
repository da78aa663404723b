"""The ChatBackend contract, proved alike by the engine in this process, by Pagoda's own server
on 127.0.0.1 and by the fake server in vLLM's and llama.cpp's streaming shapes."""

import asyncio
import itertools
import time
from dataclasses import dataclass

import pytest
from conftest import ENGINE, SERVED_NAME, remote, run
from fake_server import MODEL

from pagoda.app.backends import (
    BackendStoppedError,
    ChatBackend,
    ChatMessage,
    InvalidRequestError,
    PromptTooLongError,
    ReplyChunk,
    SamplingOptions,
)
from pagoda.app.backends.chat.local import LocalBackend
from pagoda.engine.async_engine import AsyncEngine

CHAT = [ChatMessage("system", "You are a helpful assistant."),
        ChatMessage("user", "Tell me a short story about a cat.")]
GREEDY = SamplingOptions(temperature=0.0, max_tokens=12)
# Far more than any of the backends' contexts (2048 tokens).
TOO_LONG = [ChatMessage("user", "word " * 3000)]


@dataclass
class Case:
    """A backend under test and what it is expected to know about itself."""

    backend: ChatBackend
    model_name: str
    exact_counts: bool
    knows_context: bool
    slow_down: object = None  # makes the next reply long and slow (the fakes are instant)


@pytest.fixture(params=["local", "pagoda-server", "fake-vllm", "fake-llama.cpp"])
def case(request) -> Case:
    kind = request.param
    if kind == "local":
        backend = request.getfixturevalue("local_backend")
        return Case(backend, backend.engine.engine.loaded.name, True, True)
    if kind == "pagoda-server":
        server = request.getfixturevalue("pagoda_server")
        return Case(remote(f"{server.url}/v1"), SERVED_NAME, True, True)
    fake, url = request.getfixturevalue("fake_vllm" if kind == "fake-vllm" else "fake_llama_cpp")

    def slow_down() -> None:
        fake.fault.endless = True
        fake.fault.delay_s = 0.02

    return Case(remote(url), MODEL, kind == "fake-vllm", True, slow_down)


async def collect(backend: ChatBackend, messages=CHAT, options=GREEDY,
                  request_id: str | None = None) -> list[ReplyChunk]:
    return [chunk async for chunk in backend.stream(messages, options, request_id)]


def test_backend_satisfies_the_protocol(case):
    assert isinstance(case.backend, ChatBackend)


def test_deltas_join_into_the_reply_text(case):
    chunks = run(collect(case.backend))
    assert chunks[-1].text
    assert "".join(c.delta_text for c in chunks) == chunks[-1].text
    assert all(c.text.startswith(prev.text) for prev, c in itertools.pairwise(chunks))


def test_only_the_last_chunk_is_finished_and_it_carries_the_counts(case):
    chunks = run(collect(case.backend))
    assert [c.finished for c in chunks] == [False] * (len(chunks) - 1) + [True]
    last = chunks[-1]
    assert last.finish_reason in ("stop", "length")
    assert last.num_prompt_tokens > 0
    assert 0 < last.num_output_tokens <= GREEDY.max_tokens
    assert last.time_to_first_token is not None and last.time_to_first_token >= 0


def test_max_tokens_ends_the_reply_with_length(case):
    chunks = run(collect(case.backend, options=SamplingOptions(temperature=0.0, max_tokens=3)))
    assert chunks[-1].finish_reason == "length"
    assert chunks[-1].num_output_tokens == 3


def test_stop_string_ends_the_reply_before_it(case):
    text = run(collect(case.backend))[-1].text
    words = text.split()
    stop = words[len(words) // 2]
    chunks = run(collect(case.backend, options=SamplingOptions(temperature=0.0, max_tokens=12,
                                                               stop=(stop,))))
    assert chunks[-1].finish_reason == "stop"
    assert chunks[-1].text == text[:text.index(stop)]


def test_abort_ends_the_stream_promptly_with_abort(case):
    if case.slow_down:
        case.slow_down()

    async def abort_after_first_chunk() -> tuple[list[ReplyChunk], float]:
        chunks, aborted_at = [], None
        options = SamplingOptions(temperature=0.0, max_tokens=500)
        async for chunk in case.backend.stream(CHAT, options, "to-abort"):
            if aborted_at is None:
                case.backend.abort("to-abort")
                aborted_at = time.monotonic()
            chunks.append(chunk)
        return chunks, time.monotonic() - aborted_at

    chunks, waited = run(abort_after_first_chunk())
    assert chunks[-1].finish_reason == "abort"
    assert chunks[-1].text == "".join(c.delta_text for c in chunks)
    assert waited < 2.0


def test_abort_of_an_unknown_request_is_ignored(case):
    case.backend.abort("no-such-request")
    assert run(collect(case.backend))[-1].finished


def test_model_name_and_context_length_are_known(case):
    run(collect(case.backend, options=SamplingOptions(max_tokens=1)))
    assert case.backend.model_name == case.model_name
    assert case.backend.max_model_len > 0
    assert case.backend.max_model_len_known == case.knows_context


def test_count_tokens_grows_with_the_chat_and_says_whether_exact(case):
    short = run(case.backend.count_tokens(CHAT[:1]))
    longer = run(case.backend.count_tokens(CHAT))
    assert 0 < short.n < longer.n
    assert longer.exact == case.exact_counts


def test_chat_longer_than_the_context_is_refused_as_too_long(case):
    with pytest.raises(PromptTooLongError, match="too long"):
        run(collect(case.backend, messages=TOO_LONG))


def test_invalid_sampling_is_refused_as_an_invalid_request(case):
    with pytest.raises(InvalidRequestError):
        run(collect(case.backend, options=SamplingOptions(temperature=-1.0)))


def test_stats_report_the_last_time_to_first_token(case):
    run(collect(case.backend))
    stats = case.backend.stats()
    assert stats.time_to_first_token is not None
    assert stats.num_running >= 0 and stats.tokens_per_s >= 0


def test_stream_after_shutdown_is_refused_as_stopped(case, make_engine):
    backend = (LocalBackend(AsyncEngine(engine=make_engine(**ENGINE)))
               if isinstance(case.backend, LocalBackend) else remote(case.backend.location))
    backend.shutdown()
    with pytest.raises(BackendStoppedError):
        run(collect(backend))


def test_local_engine_and_pagoda_server_write_the_same_greedy_reply(local_backend,
                                                                    pagoda_server):
    local = run(collect(local_backend))[-1]
    served = run(collect(remote(f"{pagoda_server.url}/v1")))[-1]
    assert served.text == local.text
    assert (served.num_prompt_tokens, served.num_output_tokens) == (
        local.num_prompt_tokens, local.num_output_tokens)


def test_abort_while_the_reply_is_starting_still_stops_it(case):
    async def abort_before_first_chunk() -> list[ReplyChunk]:
        stream = case.backend.stream(CHAT, GREEDY, "early")
        first = asyncio.ensure_future(anext(stream))
        await asyncio.sleep(0)  # the stream runs to its first wait: tokenizing, or connecting
        case.backend.abort("early")
        return [await first] + [chunk async for chunk in stream]

    chunks = run(abort_before_first_chunk())
    assert chunks == [ReplyChunk("", "", "abort")]
