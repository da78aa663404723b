"""The local server model: it serves the host's current model on 127.0.0.1, follows model
switches, fails clearly on a taken port, frees its port when off, and checks an API key of
which it keeps only the SHA-256. Over a fake engine; the HTTP server is real."""

import hashlib
import os
import socket
import stat
import threading

import httpx
import pytest

from pagoda.app.components.server.api_key import KEY_FILENAME, ApiKeyFile
from pagoda.app.components.server.local_server import LocalServer
from pagoda.app.qt.models.engine_host import EngineHost
from tests.app.qt.fake_engine import IdleEngine

WAIT_MS = 5_000
FIRST = "first-model"




class _Models:
    """The host's factory: a fake engine named after the model; a load waits while `gate` is
    clear."""

    def __init__(self) -> None:
        self.gate = threading.Event()
        self.gate.set()

    def __call__(self, model, config, on_progress):
        self.gate.wait(WAIT_MS / 1000)
        return IdleEngine(model or FIRST)


@pytest.fixture
def models() -> _Models:
    return _Models()


@pytest.fixture
def host(qloop, qtbot, models):
    host = EngineHost(factory=models)
    qtbot.waitUntil(host.load(None).done, timeout=WAIT_MS)
    yield host
    host.shutdown()


@pytest.fixture
def key_file(tmp_path) -> ApiKeyFile:
    return ApiKeyFile(tmp_path / "config" / KEY_FILENAME)


@pytest.fixture
def server(host, key_file):
    """Off, on a free port of 127.0.0.1 once started."""
    server = LocalServer(host, key_file, port=0)
    yield server
    server.shutdown()


def _get_models(server, key: str | None = None) -> httpx.Response:
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    return httpx.get(f"{server.address}/v1/models", headers=headers, timeout=10)


def _model_ids(server) -> list[str]:
    response = _get_models(server)
    assert response.status_code == 200
    return [m["id"] for m in response.json()["data"]]


def _listening_socket(port: int = 0) -> socket.socket:
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", port))
    sock.listen()
    return sock


def _port(address: str) -> int:
    return int(address.rsplit(":", 1)[1])


def test_turned_on_it_serves_the_loaded_model_on_localhost(server):
    assert server.start()
    assert server.address.startswith("http://127.0.0.1:")
    assert _model_ids(server) == [FIRST]
    assert server.view().address == server.address and server.view().error == ""


def test_a_model_switch_shows_in_v1_models_and_requests_get_503_while_it_loads(
        server, host, models, qtbot):
    server.start()
    models.gate.clear()
    loading = host.load("second-model")
    assert _model_ids(server) == []
    refused = httpx.post(f"{server.address}/v1/completions", timeout=10,
                         json={"prompt": "Hi", "max_tokens": 2})
    assert refused.status_code == 503
    assert refused.json()["error"]["code"] == "model_loading"
    models.gate.set()
    qtbot.waitUntil(loading.done, timeout=WAIT_MS)
    assert _model_ids(server) == ["second-model"]


def test_a_taken_port_leaves_the_server_off_with_a_message_naming_the_port(server):
    with _listening_socket() as taken:
        server.port = taken.getsockname()[1]
        assert not server.start()
    view = server.view()
    assert view.address is None and not server.is_running
    assert f"Port {server.port} is in use" in view.error
    assert "choose another port" in view.error


def test_turning_off_frees_the_port(server):
    server.start()
    address = server.address
    server.stop()
    assert server.view().address is None
    with pytest.raises(httpx.ConnectError):
        httpx.get(f"{address}/v1/models", timeout=5)
    _listening_socket(_port(address)).close()


def test_a_generated_key_is_kept_only_as_its_digest_in_a_file_only_the_user_can_read(
        server, key_file, run_async):
    key = run_async(server.new_key())
    assert key.startswith("sk-pagoda-") and len(key) > 40
    kept = key_file.path.read_text()
    assert kept.strip() == hashlib.sha256(key.encode()).hexdigest()
    assert key not in kept
    assert stat.S_IMODE(os.stat(key_file.path).st_mode) == 0o600
    assert server.view().key_set


def test_with_a_key_set_v1_requests_need_it(server, run_async):
    key = run_async(server.new_key())
    server.start()
    assert _get_models(server).status_code == 401
    assert _get_models(server, "sk-pagoda-wrong").status_code == 401
    assert _get_models(server, key).status_code == 200


def test_a_new_key_retires_the_old_one_on_a_running_server(server, run_async):
    server.start()
    old = run_async(server.new_key())
    new = run_async(server.new_key())
    assert _get_models(server, old).status_code == 401
    assert _get_models(server, new).status_code == 200


def test_removing_the_key_opens_the_server_to_requests_without_one(server, key_file, run_async):
    server.start()
    run_async(server.new_key())
    run_async(server.remove_key())
    assert not key_file.path.exists() and not server.view().key_set
    assert _get_models(server).status_code == 200


def test_a_damaged_key_file_keeps_the_server_off_and_says_what_to_do(server, key_file):
    key_file.path.parent.mkdir(parents=True)
    key_file.path.write_text("not a digest\n")
    assert not server.start()
    assert "damaged" in server.error and "generate a new one" in server.error
    assert server.view().address is None
