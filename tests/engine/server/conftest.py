"""A server on 127.0.0.1 (an ephemeral port) over one AsyncEngine on the shared default model."""

import pytest

from pagoda.engine.async_engine import AsyncEngine
from pagoda.engine.server.api import ServerSettings, build_app
from pagoda.engine.server.runner import ServerThread
from pagoda.engine.server.served import ServedModel

# One thread: the two cores are shared with the server's and the client's threads.
ENGINE = {"num_kv_blocks": 128, "num_threads": 1}
MODEL = "smollm2-test"


@pytest.fixture(scope="module")
def async_engine(make_engine):
    engine = AsyncEngine(engine=make_engine(**ENGINE))
    yield engine
    engine.shutdown()


@pytest.fixture(scope="module")
def served(async_engine) -> ServedModel:
    return ServedModel(MODEL, async_engine, async_engine.max_model_len,
                       created=async_engine.model_created)


@pytest.fixture(scope="module")
def start_server(served):
    """start_server(settings, source=...) -> a running ServerThread, stopped after the module."""
    running = []

    def start(settings: ServerSettings | None = None, source=None) -> ServerThread:
        server = ServerThread(build_app(source or (lambda: served), settings)).start()
        running.append(server)
        return server

    yield start
    for server in running:
        server.stop()


@pytest.fixture(scope="module")
def server(start_server) -> ServerThread:
    return start_server()


@pytest.fixture(scope="module")
def client(server):
    from openai import OpenAI

    return OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0, timeout=60)
