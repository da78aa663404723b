"""Backends under test: the engine in this process, Pagoda's own server over it on 127.0.0.1,
and the fake server in vLLM's and llama.cpp's shapes. Engines share the session's model."""

import asyncio

import pytest
from fake_server import LLAMA_CPP, FakeServer

from pagoda.app.backends.chat.local import LocalBackend
from pagoda.app.backends.remote.openai_remote import OpenAIBackend
from pagoda.engine.async_engine import AsyncEngine
from pagoda.engine.server.api import ServerSettings, build_app
from pagoda.engine.server.runner import ServerThread
from pagoda.engine.server.served import ServedModel

# One thread: the cores are shared with the servers' and the client's threads.
ENGINE = {"num_kv_blocks": 128, "num_threads": 1}
SERVED_NAME = "smollm2-test"
# Every test finishes well within this, or fails rather than hangs.
TEST_TIMEOUT_S = 60


def run(coro, timeout: float = TEST_TIMEOUT_S):
    """Drive a coroutine to the end on a fresh loop, failing after `timeout` seconds."""
    return asyncio.run(asyncio.wait_for(coro, timeout))


def remote(url: str, **kwargs) -> OpenAIBackend:
    kwargs.setdefault("connect_timeout", 5)
    kwargs.setdefault("response_timeout", 30)
    return OpenAIBackend(url, **kwargs)


@pytest.fixture(scope="session")
def local_backend(make_engine):
    backend = LocalBackend(AsyncEngine(engine=make_engine(**ENGINE)))
    yield backend
    backend.shutdown()


@pytest.fixture(scope="session")
def pagoda_engine(make_engine):
    engine = AsyncEngine(engine=make_engine(**ENGINE))
    yield engine
    engine.shutdown()


@pytest.fixture(scope="session")
def start_pagoda(pagoda_engine):
    """start_pagoda(settings=None) -> Pagoda's server on 127.0.0.1 over the shared engine."""
    served = ServedModel(SERVED_NAME, pagoda_engine, pagoda_engine.engine.max_model_len)
    running = []

    def start(settings: ServerSettings | None = None) -> ServerThread:
        server = ServerThread(build_app(lambda: served, settings)).start()
        running.append(server)
        return server

    yield start
    for server in running:
        server.stop()


@pytest.fixture(scope="session")
def pagoda_server(start_pagoda) -> ServerThread:
    return start_pagoda()


def _serve(shape):
    fake = FakeServer(shape)
    thread = ServerThread(fake.app()).start()
    return fake, thread


@pytest.fixture(scope="session")
def _fake_llama_cpp_thread():
    fake, thread = _serve(LLAMA_CPP)
    yield fake, thread
    thread.stop()


@pytest.fixture
def fake_llama_cpp(_fake_llama_cpp_thread) -> tuple[FakeServer, str]:
    fake, thread = _fake_llama_cpp_thread
    fake.reset()
    return fake, f"{thread.url}/v1"
