"""The server bounds the connections it holds: a client that does not send its headers in time
is closed (slowloris), and past the most connections open a client gets 503, while others are
served."""

import http.client
import select
import socket
import time

import httpx
import pytest

from pagoda.engine.cli.serve import add_serve_options
from pagoda.engine.server.api import build_app
from pagoda.engine.server.connections import (
    DEFAULT_HEADER_TIMEOUT,
    DEFAULT_MAX_CONNECTIONS,
    ConnectionLimits,
)
from pagoda.engine.server.runner import ServerThread

TIMEOUT = 0.5


@pytest.fixture
def start():
    """start(limits) -> a running server with no model (/v1/models answers), stopped after."""
    running = []

    def run(limits: ConnectionLimits) -> ServerThread:
        server = ServerThread(build_app(lambda: None), limits=limits).start()
        running.append(server)
        return server

    yield run
    for server in running:
        server.stop()


def closed_after(sock: socket.socket, limit: float = 10.0) -> tuple[float, bytes]:
    """Seconds until the server closed `sock`, and what it sent before."""
    began = time.monotonic()
    sock.settimeout(limit)
    received = b""
    while chunk := sock.recv(4096):
        received += chunk
    return time.monotonic() - began, received


@pytest.mark.parametrize("sent", [b"", b"POST /v1/completions HTTP/1.1\r\nHost: localhost\r\nContent-"],
                         ids=["nothing", "half-the-headers"])
def test_a_client_that_does_not_send_its_headers_in_time_is_closed(start, sent):
    server = start(ConnectionLimits(header_timeout=TIMEOUT))
    with socket.create_connection((server.host, server.port)) as slow:
        slow.sendall(sent)
        # Another client is served meanwhile.
        assert httpx.get(f"{server.url}/v1/models", timeout=5).json()["data"] == []
        took, answer = closed_after(slow)
    assert took < TIMEOUT + 2.0
    assert answer.startswith(b"HTTP/1.1 408 ") and b"header_timeout" in answer


def test_a_slow_second_request_on_a_kept_alive_connection_is_closed_too(start):
    server = start(ConnectionLimits(header_timeout=TIMEOUT))
    with socket.create_connection((server.host, server.port)) as client:
        client.sendall(b"GET /v1/models HTTP/1.1\r\nHost: localhost\r\n\r\n")
        client.settimeout(5)
        assert client.recv(4096).startswith(b"HTTP/1.1 200 ")
        client.sendall(b"GET /v1/models HTTP/1.1\r\nHo")  # and then nothing more
        took, answer = closed_after(client)
    assert took < TIMEOUT + 2.0  # uvicorn's keep-alive timeout stops once a byte arrives
    assert answer.startswith(b"HTTP/1.1 408 ")


def test_a_client_with_headers_in_time_is_answered(start):
    server = start(ConnectionLimits(header_timeout=TIMEOUT))
    with socket.create_connection((server.host, server.port)) as client:
        for part in (b"GET /v1/models HTTP/1.1\r\n", b"Host: localhost\r\n", b"\r\n"):
            client.sendall(part)
            time.sleep(TIMEOUT / 4)
        client.settimeout(5)
        assert client.recv(4096).startswith(b"HTTP/1.1 200 ")


def test_past_the_most_connections_a_client_gets_503_until_one_closes(start):
    server = start(ConnectionLimits(header_timeout=30, max_connections=3))
    busy = [socket.create_connection((server.host, server.port)) for _ in range(3)]
    for sock in busy:  # each request runs, waiting for a body that does not come
        sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: localhost\r\nContent-Length: 100\r\n"
                     b"Expect: 100-continue\r\n\r\n")
        sock.settimeout(5)
        assert sock.recv(4096).startswith(b"HTTP/1.1 100 ")  # its headers were read
    reply = httpx.get(f"{server.url}/v1/models", timeout=5)
    assert reply.status_code == 503
    assert reply.json()["error"]["code"] == "too_many_connections"
    busy.pop().close()
    deadline = time.monotonic() + 5
    while (reply := httpx.get(f"{server.url}/v1/models", timeout=5)).status_code == 503 \
            and time.monotonic() < deadline:
        time.sleep(0.05)
    assert reply.status_code == 200
    for sock in busy:
        sock.close()


def test_a_client_idle_after_its_reply_makes_room_for_a_new_one(start):
    server = start(ConnectionLimits(header_timeout=30, max_connections=3))
    held = [http.client.HTTPConnection(server.host, server.port, timeout=5) for _ in range(3)]
    for connection in held:  # each answered, then kept alive: all three are open
        connection.request("GET", "/v1/models")
        assert connection.getresponse().read()
    assert httpx.get(f"{server.url}/v1/models", timeout=5).status_code == 200
    for connection in held:
        connection.close()


def test_a_crowd_of_slow_clients_does_not_keep_a_prompt_one_out(start):
    server = start(ConnectionLimits(header_timeout=30, max_connections=3))
    slow = [socket.create_connection((server.host, server.port)) for _ in range(3)]
    for sock in slow:  # answered once (so surely open), then slow with the next request
        sock.sendall(b"GET /v1/models HTTP/1.1\r\nHost: localhost\r\n\r\n")
        sock.settimeout(5)
        assert sock.recv(4096).startswith(b"HTTP/1.1 200 ")
        sock.sendall(b"GET /v1/models HTTP/1.1\r\nHo")
    time.sleep(0.2)  # the server reads those bytes, and times the headers they begin
    assert httpx.get(f"{server.url}/v1/models", timeout=5).status_code == 200
    # One slow client made room: the one that waited longest for its headers, or, on a loaded
    # machine where the server had not yet read their bytes, one idle after its reply.
    readable, _, _ = select.select(slow, [], [], 5)
    assert len(readable) == 1
    _, answer = closed_after(readable[0])
    assert b"too_many_connections" in answer
    for sock in slow:
        sock.close()


def test_serve_options_default_to_the_connection_limits():
    import argparse

    parser = argparse.ArgumentParser()
    add_serve_options(parser)
    args = parser.parse_args([])
    assert args.header_timeout == DEFAULT_HEADER_TIMEOUT
    assert args.max_connections == DEFAULT_MAX_CONNECTIONS


@pytest.mark.parametrize("option", [["--header-timeout", "0"], ["--max-connections", "-1"],
                                    ["--header-timeout", "inf"]])
def test_serve_refuses_limits_that_bound_nothing(option, capsys):
    import argparse

    parser = argparse.ArgumentParser()
    add_serve_options(parser)
    with pytest.raises(SystemExit):
        parser.parse_args(option)
    assert "must be a positive number" in capsys.readouterr().err
