"""What the user is told when a server is down, silent, refuses, or breaks off a reply: the
right BackendError, in words naming the server, with the text that had arrived kept."""

import socket
import threading
import time

import pytest
from conftest import remote, run
from fake_server import PIECES, REPLY

from pagoda.app.backends import (
    BackendNotAnsweringError,
    BackendUnreachableError,
    ChatMessage,
    ConnectionDroppedError,
    MalformedStreamError,
    ModelNotFoundError,
    ReplyChunk,
    SamplingOptions,
    ServerError,
    UnauthorizedError,
)
from pagoda.engine.server.api import ServerSettings

CHAT = [ChatMessage("user", "Hello?")]
OPTIONS = SamplingOptions(temperature=0.0, max_tokens=50)


async def collect(backend, into: list[ReplyChunk] | None = None) -> list[ReplyChunk]:
    chunks = [] if into is None else into
    async for chunk in backend.stream(CHAT, OPTIONS):
        chunks.append(chunk)
    return chunks


def fails_with(backend, error: type[Exception]) -> tuple[Exception, list[ReplyChunk]]:
    """The error the reply ends with, and the chunks yielded before it."""
    chunks: list[ReplyChunk] = []
    with pytest.raises(error) as caught:
        run(collect(backend, chunks))
    return caught.value, chunks


@pytest.fixture
def silent_server():
    """A port that takes connections (the kernel completes them) but never answers."""
    with socket.create_server(("127.0.0.1", 0)) as sock:
        yield f"http://127.0.0.1:{sock.getsockname()[1]}/v1"


@pytest.fixture
def hanging_up_server():
    """A port that accepts each connection and closes it at once."""
    sock = socket.create_server(("127.0.0.1", 0))

    def hang_up() -> None:
        while True:
            try:
                conn, _ = sock.accept()
            except OSError:
                return
            conn.close()

    threading.Thread(target=hang_up, daemon=True).start()
    yield f"http://127.0.0.1:{sock.getsockname()[1]}/v1"
    sock.close()


def test_refused_connection_is_unreachable_at_once(closed_port):
    url = f"http://127.0.0.1:{closed_port}/v1"
    started = time.monotonic()
    error, _ = fails_with(remote(url), BackendUnreachableError)
    assert time.monotonic() - started < 2.0
    assert url in str(error) and "running" in str(error)


def test_a_server_that_refused_is_known_unreachable_until_it_answers(closed_port, fake_vllm):
    down = remote(f"http://127.0.0.1:{closed_port}/v1")
    assert down.endpoint.unreachable is None  # not asked yet
    error, _ = fails_with(down, BackendUnreachableError)
    assert down.endpoint.unreachable == str(error)

    _fake, url = fake_vllm
    back = remote(url)
    back.endpoint.unreachable = str(error)  # as if it had been down when last asked
    run(collect(back))
    assert back.endpoint.unreachable is None


def test_a_server_that_answers_with_an_error_is_not_unreachable(fake_vllm):
    fake, url = fake_vllm
    fake.api_key = "right"
    backend = remote(url, api_key="wrong")
    fails_with(backend, UnauthorizedError)
    assert backend.endpoint.unreachable is None


def test_server_that_never_answers_is_reported_after_the_response_timeout(silent_server):
    started = time.monotonic()
    error, _ = fails_with(remote(silent_server, response_timeout=0.5), BackendNotAnsweringError)
    assert 0.4 < time.monotonic() - started < 5.0
    assert silent_server in str(error) and "0.5 s" in str(error)


def test_server_that_hangs_up_without_answering_is_a_dropped_connection(hanging_up_server):
    error, _ = fails_with(remote(hanging_up_server), ConnectionDroppedError)
    assert "without answering" in str(error)


def test_wrong_api_key_is_unauthorized(fake_vllm):
    fake, url = fake_vllm
    fake.api_key = "right"
    error, _ = fails_with(remote(url, api_key="wrong"), UnauthorizedError)
    assert "401" in str(error) and "API key" in str(error)


def test_missing_api_key_is_unauthorized_by_pagodas_server(start_pagoda):
    server = start_pagoda(ServerSettings(api_key="secret"))
    fails_with(remote(f"{server.url}/v1"), UnauthorizedError)
    assert run(collect(remote(f"{server.url}/v1", api_key="secret")))[-1].finished


def test_model_the_server_does_not_serve_is_not_found_with_the_served_ones(fake_vllm):
    _, url = fake_vllm
    error, _ = fails_with(remote(url, model="llama-9000"), ModelNotFoundError)
    assert "'llama-9000'" in str(error) and "'fake-model'" in str(error)


def test_404_on_the_reply_is_model_not_found(fake_vllm):
    fake, url = fake_vllm
    fake.fault.status, fake.fault.body = 404, {"detail": "Not Found"}
    error, _ = fails_with(remote(url), ModelNotFoundError)
    assert "404" in str(error) and "/v1" in str(error)


@pytest.mark.parametrize("body", [
    {"error": {"message": "CUDA out of memory", "type": "server_error", "code": None}},
    {"object": "error", "message": "CUDA out of memory", "type": "InternalServerError",
     "code": 500},
    "CUDA out of memory",
], ids=["openai-shape", "vllm-shape", "plain-text"])
def test_server_error_says_the_servers_own_words(fake_vllm, body):
    fake, url = fake_vllm
    fake.fault.status, fake.fault.body = 500, body
    error, _ = fails_with(remote(url), ServerError)
    assert error.status == 500
    assert "CUDA out of memory" in str(error) and url in str(error)


def test_malformed_chunk_is_reported_and_the_text_before_it_kept(fake_vllm):
    fake, url = fake_vllm
    fake.fault.malformed_after = 3
    error, chunks = fails_with(remote(url), MalformedStreamError)
    assert error.partial_text == "".join(PIECES[:3]) == chunks[-1].text
    assert "not JSON" in str(error)


def test_connection_dropped_mid_reply_keeps_the_text_so_far(fake_vllm):
    fake, url = fake_vllm
    fake.fault.drop_after = 4
    error, chunks = fails_with(remote(url), ConnectionDroppedError)
    assert error.partial_text == "".join(PIECES[:4]) == chunks[-1].text
    assert "kept" in str(error)


def test_stream_closed_before_the_reply_finished_is_a_dropped_connection(fake_llama_cpp):
    fake, url = fake_llama_cpp
    fake.fault.close_after = 2
    error, _ = fails_with(remote(url), ConnectionDroppedError)
    assert error.partial_text == "".join(PIECES[:2])


def test_error_sent_mid_reply_is_a_server_error_with_the_text_so_far(fake_vllm):
    fake, url = fake_vllm
    fake.fault.error_after = 5
    error, _ = fails_with(remote(url), ServerError)
    assert error.partial_text == "".join(PIECES[:5])
    assert "the engine died" in str(error)


def test_answer_that_is_not_a_stream_is_malformed(fake_vllm):
    fake, url = fake_vllm
    fake.fault.not_a_stream = True
    error, _ = fails_with(remote(url), MalformedStreamError)
    assert "stream" in str(error)


def test_keep_alive_comments_are_not_part_of_the_reply(fake_vllm, fake_llama_cpp):
    for _, url in (fake_vllm, fake_llama_cpp):
        assert run(collect(remote(url)))[-1].text == REPLY


def test_slow_stream_that_keeps_sending_is_never_cut(fake_vllm):
    fake, url = fake_vllm
    fake.fault.delay_s = 0.15
    chunks = run(collect(remote(url, response_timeout=0.1)))
    assert chunks[-1].text == REPLY and chunks[-1].finish_reason == "stop"


def test_abort_closes_the_connection_so_the_server_stops(fake_vllm):
    fake, url = fake_vllm
    fake.fault.endless, fake.fault.delay_s = True, 0.02
    backend = remote(url)

    async def abort_after_two_chunks() -> None:
        async for chunk in backend.stream(CHAT, OPTIONS, "r1"):
            if len(chunk.text) > len(" more"):
                backend.abort("r1")

    run(abort_after_two_chunks())
    assert fake.stream_closed.wait(2.0)


def test_leaving_the_stream_early_closes_the_connection(fake_vllm):
    fake, url = fake_vllm
    fake.fault.endless, fake.fault.delay_s = True, 0.02
    backend = remote(url)

    async def leave_after_first_chunk() -> None:
        stream = backend.stream(CHAT, OPTIONS)
        await anext(stream)
        await stream.aclose()

    run(leave_after_first_chunk())
    assert fake.stream_closed.wait(2.0)
    assert backend.stats().num_running == 0


def test_shutdown_ends_streams_in_flight_with_abort(fake_vllm):
    fake, url = fake_vllm
    fake.fault.endless, fake.fault.delay_s = True, 0.02
    backend = remote(url)

    async def shut_down_after_first_chunk() -> list[ReplyChunk]:
        chunks = []
        async for chunk in backend.stream(CHAT, OPTIONS):
            if not chunks:
                backend.shutdown()
            chunks.append(chunk)
        return chunks

    assert run(shut_down_after_first_chunk())[-1].finish_reason == "abort"
