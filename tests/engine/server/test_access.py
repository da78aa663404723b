"""Who the server answers: the key on every route but the probes, and the Host a request names
(a server on loopback refuses other names, against DNS rebinding). No model is needed: access
is decided before a route runs."""

from __future__ import annotations

import argparse
import gc
from collections.abc import Iterator

import httpx
import pytest
from fastapi.routing import APIRoute

from pagoda.engine.cli.serve import add_serve_options, run_serve
from pagoda.engine.server import runner
from pagoda.engine.server.api import ServerSettings, build_app
from pagoda.engine.server.runner import ServerThread
from pagoda.engine.server.security import PUBLIC_PATHS, host_name

KEY = "sk-test-0123456789"
PROBES = {"/health", "/metrics"}


@pytest.fixture
def start() -> Iterator:
    running: list[ServerThread] = []

    def start_server(settings: ServerSettings | None = None, app=None) -> ServerThread:
        server = ServerThread(app or build_app(lambda: None, settings)).start()
        running.append(server)
        return server

    yield start_server
    for server in running:
        server.stop()


def routes(settings: ServerSettings) -> list[tuple[str, str]]:
    app = build_app(lambda: None, settings)
    return [(method, route.path) for route in app.routes if isinstance(route, APIRoute)
            for method in sorted(route.methods)]


def send(server: ServerThread, method: str, path: str, **headers: str) -> httpx.Response:
    return httpx.request(method, f"{server.url}{path}", headers=headers, timeout=30,
                         **({"json": {}} if method == "POST" else {}))


def test_with_a_key_every_route_but_the_probes_needs_it(start) -> None:
    settings = ServerSettings(api_key=KEY)
    server = start(settings)
    found = routes(settings)
    assert {"/detokenize", "/tokenize", "/v1/chat/completions", "/v1/models"} \
        <= {path for _, path in found}
    assert PUBLIC_PATHS == PROBES
    for method, path in found:
        without = send(server, method, path)
        wrong = send(server, method, path, Authorization="Bearer sk-wrong")
        right = send(server, method, path, Authorization=f"Bearer {KEY}")
        if path in PROBES:
            assert without.status_code != 401, (method, path)
        else:
            assert without.status_code == 401, (method, path, without.text)
            error = without.json()["error"]
            # Anthropic's routes answer in its shape, which has a type and no code.
            assert error.get("code", error["type"]) in ("invalid_api_key",
                                                        "authentication_error")
            assert wrong.status_code == 401, (method, path)
        assert right.status_code != 401, (method, path)


def test_with_a_key_an_unknown_path_is_refused_before_it_is_looked_up(start) -> None:
    server = start(ServerSettings(api_key=KEY))
    assert send(server, "GET", "/v2/secret").status_code == 401
    assert send(server, "GET", "/v2/secret", Authorization=f"Bearer {KEY}").status_code == 404


@pytest.mark.parametrize("host", ["evil.example", "evil.example:8000", "192.168.1.5:8000",
                                  "localhost.evil.example", "127.0.0.1.nip.io", "[::2]:80", ""])
def test_a_server_on_loopback_refuses_a_request_naming_another_host(start, host: str) -> None:
    server = start()
    refused = send(server, "GET", "/v1/models", Host=host)
    assert refused.status_code == 403, refused.text
    error = refused.json()["error"]
    assert error["code"] == "host_not_allowed"
    assert repr(host_name(host.encode())) in error["message"]
    assert "--allowed-hosts" in error["message"]
    assert send(server, "GET", "/health", Host=host).status_code == 403


@pytest.mark.parametrize("host", ["localhost", "localhost:8000", "LOCALHOST.", "127.0.0.1",
                                  "127.0.0.1:1234", "127.0.0.2", "[::1]", "[::1]:8000",
                                  "app.localhost:5173"])
def test_a_server_on_loopback_answers_loopback_names(start, host: str) -> None:
    server = start()
    assert send(server, "GET", "/v1/models", Host=host).status_code == 200


def test_clients_that_name_the_address_they_connect_to_are_answered(start) -> None:
    server = start()
    assert httpx.get(f"{server.url}/v1/models").status_code == 200
    with_key = start(ServerSettings(api_key=KEY))
    assert httpx.get(f"{with_key.url}/v1/models",
                     headers={"Authorization": f"Bearer {KEY}"}).status_code == 200


def test_allowed_hosts_let_other_names_through(start) -> None:
    named = start(ServerSettings(allowed_hosts=("pagoda.lan",)))
    assert send(named, "GET", "/v1/models", Host="pagoda.lan:8000").status_code == 200
    assert send(named, "GET", "/v1/models", Host="PAGODA.LAN").status_code == 200
    assert send(named, "GET", "/v1/models", Host="other.lan").status_code == 403
    anything = start(ServerSettings(allowed_hosts=("*",)))
    assert send(anything, "GET", "/v1/models", Host="other.lan").status_code == 200


def test_a_server_on_another_address_answers_whatever_name_reaches_it(start) -> None:
    # Such a server needs a key, which a page rebinding a name does not have.
    server = start(ServerSettings(api_key=KEY, listen_host="0.0.0.0"))
    assert send(server, "GET", "/v1/models", Host="gpu-box:8000",
                Authorization=f"Bearer {KEY}").status_code == 200


def test_serve_takes_allowed_hosts(start, monkeypatch: pytest.MonkeyPatch) -> None:
    parser = argparse.ArgumentParser()
    add_serve_options(parser)
    args = parser.parse_args(["--port", "0", "--allowed-hosts", "pagoda.lan", "box.lan"])
    args.served_model_name = None
    apps = []
    monkeypatch.setattr(runner, "serve_forever", lambda app, *_: apps.append(app))
    try:
        run_serve(args, lambda _: _Engine())
    finally:
        gc.unfreeze()  # serving froze the heap; the rest of this test process collects as before
    server = start(app=apps[0])
    assert send(server, "GET", "/v1/models", Host="box.lan").status_code == 200
    assert send(server, "GET", "/v1/models", Host="evil.example").status_code == 403


class _Engine:
    model_name, max_model_len, model_created = "tiny", 64, 0

    def shutdown(self) -> None:
        pass
