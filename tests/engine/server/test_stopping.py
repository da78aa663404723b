"""A server that stops ends its replies with a last chunk, leaves the engine serving, and logs
nothing. (The `python -m pagoda.engine serve` process under SIGINT and SIGTERM: test_serve_command.py.)"""

import asyncio
import concurrent.futures
import json
import time

import httpx
from fastapi import FastAPI
from fastapi.responses import StreamingResponse

from pagoda.engine.server import runner
from pagoda.engine.server.runner import ServerThread
from tests.engine.server.conftest import MODEL

LONG = {"model": MODEL, "prompt": "Once upon a time", "max_tokens": 1500, "stream": True,
        "ignore_eos": True, "temperature": 0}


def test_stopping_the_server_ends_its_streams_with_abort_and_the_engine_serves_on(
        start_server, async_engine):
    server = start_server()
    with httpx.stream("POST", f"{server.url}/v1/completions", json=LONG, timeout=60) as response:
        lines = (line for line in response.iter_lines() if line.startswith("data: "))
        next(lines)
        server.stop()  # what the app does when its local server is turned off
        rest = list(lines)
    assert json.loads(rest[-2][len("data: "):])["choices"][0]["finish_reason"] == "abort"
    assert rest[-1] == "data: [DONE]"
    again = start_server()  # the engine, shared with the app's tabs, was not stopped
    reply = httpx.post(f"{again.url}/v1/completions", timeout=60,
                       json={"prompt": "Hello", "max_tokens": 2, "ignore_eos": True})
    assert reply.json()["usage"]["completion_tokens"] == 2


def test_stopping_the_server_answers_a_whole_reply_with_what_it_has(start_server,
                                                                    async_engine):
    server = start_server()
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        reply = pool.submit(httpx.post, f"{server.url}/v1/completions", timeout=60,
                            json={**LONG, "stream": False})
        deadline = time.monotonic() + 30
        while async_engine.stats().num_running == 0 and time.monotonic() < deadline:
            time.sleep(0.01)
        server.stop()
        answer = reply.result()
    assert answer.status_code == 200
    assert answer.json()["choices"][0]["finish_reason"] == "abort"


def test_stopping_the_server_answers_embeddings_in_flight_with_a_503(start_server,
                                                                    async_engine):
    server = start_server()
    inputs = [[5] * 1500] * 16  # one at a time in this engine's 128 blocks: seconds of work
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        reply = pool.submit(httpx.post, f"{server.url}/v1/embeddings", timeout=60,
                            json={"model": MODEL, "input": inputs})
        deadline = time.monotonic() + 30
        while async_engine.stats().num_running == 0 and time.monotonic() < deadline:
            time.sleep(0.01)
        server.stop()
        answer = reply.result()
    assert answer.status_code == 503, answer.text
    assert answer.json()["error"]["code"] == "request_aborted"
    deadline = time.monotonic() + 10
    stats = async_engine.stats()
    while (stats.num_waiting or stats.num_running) and time.monotonic() < deadline:
        time.sleep(0.01)
        stats = async_engine.stats()
    assert stats.num_waiting == stats.num_running == 0  # the other inputs were aborted too


def test_a_stopping_server_refuses_new_requests_in_words(start_server):
    server = start_server()
    server.app.state.end_requests()  # the first thing a stop does
    reply = httpx.post(f"{server.url}/v1/completions", json=LONG, timeout=60)
    assert reply.status_code == 503
    assert reply.json()["error"]["code"] == "server_stopping"
    assert "shutting down" in reply.json()["error"]["message"]


def endless_app() -> FastAPI:
    app = FastAPI()

    @app.get("/endless")
    async def endless() -> StreamingResponse:
        async def chunks():
            while True:
                yield "data: more\n\n"
                await asyncio.sleep(0.01)
        return StreamingResponse(chunks(), media_type="text/event-stream")

    return app


def test_a_reply_that_does_not_end_is_dropped_after_the_drain_time_without_a_traceback(
        monkeypatch, capfd):
    monkeypatch.setattr(runner, "DRAIN_SECONDS", 0.5, raising=False)
    server = ServerThread(endless_app()).start()
    with httpx.stream("GET", f"{server.url}/endless", timeout=30) as response:
        lines = response.iter_lines()  # kept: a dropped iterator would close the connection
        next(lines)
        began = time.monotonic()
        server.stop()
        took = time.monotonic() - began
    assert took < 2.0
    log = capfd.readouterr().err
    assert "Traceback" not in log and "ERROR" not in log, log
