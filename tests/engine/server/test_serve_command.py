"""`python -m pagoda.engine serve`: refuses what it should before loading anything, then serves."""

import argparse
import concurrent.futures
import contextlib
import gc
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time

import httpx
import pytest

from pagoda.engine.cli.main import main
from pagoda.engine.cli.serve import add_serve_options, run_serve, served_model
from pagoda.engine.server import runner
from pagoda.engine.server.remote_images import RemoteImages
from tests.engine.structured_output.schemas import SLOW_REGEX


def test_serving_a_reachable_address_without_a_key_is_refused(capsys, monkeypatch):
    monkeypatch.delenv("PAGODA_API_KEY", raising=False)
    assert main(["serve", "--host", "0.0.0.0"]) == 2
    assert "refusing to serve on 0.0.0.0 without an API key" in capsys.readouterr().err


def test_a_port_in_use_is_a_clear_error(capsys):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        assert main(["serve", "--port", str(port)]) == 2
    assert f"cannot listen on 127.0.0.1:{port}" in capsys.readouterr().err


class _LoadedEngine:
    """What run_serve reads of an engine, with objects of its own made at load."""

    model_name, max_model_len, model_created = "tiny", 64, 0

    def __init__(self) -> None:
        self.weights = [{"layer": i} for i in range(1000)]
        self.stopped = False

    def shutdown(self) -> None:
        self.stopped = True


def test_serving_keeps_what_loaded_out_of_later_garbage_collections(monkeypatch):
    frozen_when_serving = []
    monkeypatch.setattr(runner, "serve_forever",
                        lambda *args: frozen_when_serving.append(gc.get_freeze_count()))
    args = argparse.Namespace(host="127.0.0.1", port=0, api_key=None, served_model_name=None,
                              allowed_origins=[], allowed_hosts=[], header_timeout=10.0,
                              max_connections=10, force_tool_call=False,
                              allow_remote_images=False, allow_private_image_hosts=False,
                              remote_image_timeout=10.0)
    gc.unfreeze()
    loaded = _LoadedEngine()
    try:
        assert run_serve(args, lambda _: loaded) == 0
    finally:
        gc.unfreeze()  # the rest of this test process collects as before
    assert frozen_when_serving[0] > len(loaded.weights)
    assert loaded.stopped


def test_force_tool_call_reaches_the_served_model():
    parser = argparse.ArgumentParser()
    add_serve_options(parser)
    for options, forced in (([], False), (["--force-tool-call"], True)):
        served = served_model(parser.parse_args(options), _LoadedEngine())
        assert (served.name, served.force_tool_call) == ("tiny", forced)


def test_remote_image_options_reach_the_served_model():
    parser = argparse.ArgumentParser()
    add_serve_options(parser)
    for options, want in (
            ([], RemoteImages()),
            (["--allow-remote-images"], RemoteImages(allowed=True)),
            (["--allow-remote-images", "--allow-private-image-hosts",
              "--remote-image-timeout", "2.5"],
             RemoteImages(allowed=True, private_hosts=True, timeout=2.5))):
        assert served_model(parser.parse_args(options), _LoadedEngine()).remote_images == want
    with pytest.raises(ValueError, match="give both"):
        served_model(parser.parse_args(["--allow-private-image-hosts"]), _LoadedEngine())


def start_serving(*options: str, env: dict | None = None) -> tuple[subprocess.Popen, str]:
    """`python -m pagoda.engine serve` on a free port as "tiny", and its address once it serves."""
    process = subprocess.Popen(
        [sys.executable, "-m", "pagoda.engine", "serve", "--port", "0", "--served-model-name", "tiny",
         "--kv-cache-mb", "64", *options], stderr=subprocess.PIPE, text=True,
        env={**os.environ, **(env or {})})
    line = process.stderr.readline()
    match = re.search(r"Serving tiny on (http://127\.0\.0\.1:\d+)/v1", line)
    if not match:
        process.kill()
        raise AssertionError(f"the server did not start: {line}{process.stderr.read()}")
    return process, match.group(1)


@pytest.mark.slow
@pytest.mark.parametrize("stop", [signal.SIGINT, signal.SIGTERM], ids=["ctrl-c", "sigterm"])
def test_serve_answers_until_interrupted(stop, tiny_model_folder):
    process, url = start_serving("--model", str(tiny_model_folder),
                                 env={"PAGODA_API_KEY": "sk-local"})
    try:
        headers = {"Authorization": "Bearer sk-local"}
        models = httpx.get(f"{url}/v1/models", headers=headers, timeout=30).json()
        assert models["data"][0]["id"] == "tiny"
        reply = httpx.post(f"{url}/v1/completions", headers=headers, timeout=120,
                           json={"prompt": "Hello", "max_tokens": 3, "ignore_eos": True})
        assert reply.json()["usage"]["completion_tokens"] == 3
    finally:
        process.send_signal(stop)
        code = process.wait(timeout=60)
    assert code == 0


def test_the_listening_socket_turns_nagle_off_for_every_connection():
    # asyncio sets TCP_NODELAY only on sockets whose proto is IPPROTO_TCP; a keep-alive client
    # of a socket made with proto 0 waited ~40 ms for every answer (delayed ACK).
    from pagoda.engine.server.runner import bind

    sock = bind("127.0.0.1", 0)
    try:
        assert sock.proto == socket.IPPROTO_TCP
        assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY)
    finally:
        sock.close()


@pytest.mark.slow
@pytest.mark.parametrize("stop", [signal.SIGINT, signal.SIGTERM], ids=["ctrl-c", "sigterm"])
def test_a_stop_ends_live_streams_with_a_finish_reason_and_exits_quietly(stop):
    process, url = start_serving()
    long = {"max_tokens": 1500, "ignore_eos": True, "temperature": 0, "stream": True}
    bodies = {"/v1/chat/completions": {"messages": [{"role": "user", "content": "Hi"}], **long},
              "/v1/completions": {"prompt": "Once upon a time", **long}}
    try:
        with httpx.Client(timeout=60) as http, contextlib.ExitStack() as streams:
            lines = [(line for line in streams.enter_context(
                http.stream("POST", f"{url}{path}", json=body)).iter_lines()
                if line.startswith("data: ")) for path, body in bodies.items()]
            for chunks in lines:
                next(chunks), next(chunks)  # the reply is streaming
            process.send_signal(stop)
            stopped = time.monotonic()
            ends = [list(chunks)[-2:] for chunks in lines]
        code = process.wait(timeout=30)
        took = time.monotonic() - stopped
    finally:
        process.kill()
    log = process.stderr.read()
    for last, done in ends:
        assert json.loads(last[len("data: "):])["choices"][0]["finish_reason"] == "abort"
        assert done == "data: [DONE]"
    assert code == 0
    assert took < 10
    assert "Traceback" not in log and len(log.splitlines()) <= 2, log


def _compilers(pid: int) -> list[int]:
    """The grammar-compiling processes `pid` started (Linux's /proc)."""
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            with contextlib.suppress(OSError), open(f"/proc/{entry}/stat") as stat, \
                    open(f"/proc/{entry}/cmdline", "rb") as cmdline:
                parent = int(stat.read().rpartition(")")[2].split()[1])
                if parent == pid and b"serve_fd" in cmdline.read():
                    found.append(int(entry))
    return found


@pytest.mark.slow
def test_a_stop_does_not_wait_for_a_compile_and_exits_quietly(tiny_model_folder):
    process, url = start_serving("--model", str(tiny_model_folder))
    body = {"prompt": "Hello", "max_tokens": 3, "guided_regex": SLOW_REGEX}
    try:
        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            pool.submit(httpx.post, f"{url}/v1/completions", json=body, timeout=120)
            deadline = time.monotonic() + 60
            while not _compilers(process.pid) and time.monotonic() < deadline:
                time.sleep(0.1)
            [compiler] = _compilers(process.pid)
            time.sleep(3)  # the process has started compiling (a minute's work)
            process.send_signal(signal.SIGTERM)
            stopped = time.monotonic()
            code = process.wait(timeout=60)
            took = time.monotonic() - stopped
    finally:
        process.kill()
    log = process.stderr.read()
    assert code == 0
    assert took < 15  # the drain of live replies (5 s), not the compile
    assert not os.path.exists(f"/proc/{compiler}")
    assert "Traceback" not in log, log
