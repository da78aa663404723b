"""McpHub against a real MCP server (tests/app/components/tools/mcp_test_server.py): over stdio as a
subprocess, and over streamable HTTP and HTTP+SSE on uvicorn in this process.

Each `async def` test runs in an event loop of its own (conftest), never the hub's: every call
here crosses from one loop to another as the window's calls will. One hub and one running stdio
server serve most tests; the tests that stop or close servers make their own.
"""

from __future__ import annotations

import asyncio
import re
import socket
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest
import uvicorn

from pagoda.app.components.tools import (
    McpHub,
    McpServerConfig,
    ToolServerError,
    ToolTimeoutError,
)
from pagoda.app.components.tools.mcp.results import MAX_RESULT_CHARS
from pagoda.app.components.tools.mcp.stdio_streams import MiB
from tests.app.components.tools.mcp_test_server import EXIT_AT_START_ENV, build_server

TEST_SERVER = str(Path(__file__).with_name("mcp_test_server.py"))
START_TIMEOUT_S = 20.0


def stdio_server(name: str = "test", **env: str) -> McpServerConfig:
    return McpServerConfig(name, command=sys.executable, args=(TEST_SERVER,), env=env)


def served_over_http(app) -> tuple[str, uvicorn.Server, threading.Thread]:
    """Run an ASGI app on a free port of 127.0.0.1 in a thread: its base URL, server, thread."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started and time.monotonic() < deadline:
        time.sleep(0.01)
    return f"http://127.0.0.1:{sock.getsockname()[1]}", server, thread


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture(scope="module")
def http_urls() -> Iterator[dict[str, str]]:
    """The test server over streamable HTTP (/mcp) and over HTTP+SSE (/sse)."""
    http_url, http_server, http_thread = served_over_http(build_server().streamable_http_app())
    sse_url, sse_server, sse_thread = served_over_http(build_server().sse_app())
    yield {"http": f"{http_url}/mcp", "sse": f"{sse_url}/sse"}
    http_server.should_exit = sse_server.should_exit = True
    http_thread.join(5)
    sse_thread.join(5)


@pytest.fixture(scope="module")
def hub(http_urls) -> Iterator[McpHub]:
    hub = McpHub(start_timeout_s=START_TIMEOUT_S)
    hub.configure([
        stdio_server(),
        McpServerConfig("missing", command="no-such-mcp-server-command"),
        stdio_server("exits", **{EXIT_AT_START_ENV: "no API key given; set WEATHER_KEY"}),
        McpServerConfig("web", url=http_urls["http"]),
        McpServerConfig("legacy", url=http_urls["sse"], sse=True),
        McpServerConfig("nowhere", url=f"http://127.0.0.1:{free_port()}/mcp"),
        McpServerConfig("off", command=sys.executable, enabled=False),
    ])
    yield hub
    hub.close()


async def server_pid(hub: McpHub, server: str = "test") -> int:
    return int((await hub.call_tool(server, "pid", {}, timeout_s=5)).text)


def is_running(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def wait_gone(pid: int, within_s: float) -> bool:
    """Whether process `pid` is gone (or a zombie) within `within_s`."""
    deadline = time.monotonic() + within_s
    while is_running(pid):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


async def test_the_servers_tools_come_with_descriptions_and_schemas(hub):
    tools = {tool.name: tool for tool in await hub.list_tools("test")}
    assert {"add", "echo", "fail", "hang", "log"} <= set(tools)
    assert tools["add"].description == "Add two integers."
    assert tools["add"].input_schema["properties"]["a"]["type"] == "integer"
    assert tools["add"].input_schema["required"] == ["a", "b"]
    assert hub.status("test").state == "running"


async def test_add_answers_the_sum(hub):
    result = await hub.call_tool("test", "add", {"a": 2, "b": 3}, timeout_s=5)
    assert (result.text, result.is_error) == ("5", False)


async def test_a_tool_that_raises_gives_an_error_result(hub):
    result = await hub.call_tool("test", "fail", {}, timeout_s=5)
    assert result.is_error and "it failed on purpose" in result.text


async def test_an_unknown_tool_gives_an_error_result_the_model_can_read(hub):
    result = await hub.call_tool("test", "nope", {}, timeout_s=5)
    assert result.is_error and "nope" in result.text


async def test_an_image_is_named_with_its_type_and_size(hub):
    result = await hub.call_tool("test", "picture", {}, timeout_s=5)
    assert result.text == "[image: image/png, 67 bytes]"


async def test_a_long_reply_under_the_bound_is_read_and_cut_for_the_model(hub):
    result = await hub.call_tool("test", "big", {"mebibytes": 4}, timeout_s=60)
    assert not result.is_error
    assert result.text.endswith(f"[cut: the reply was {4 * MiB} characters; the first "
                                f"{MAX_RESULT_CHARS} are shown]")


async def test_a_reply_over_the_bound_is_refused_in_words_and_the_server_serves_on(hub):
    pid = await server_pid(hub)
    result = await hub.call_tool("test", "big", {"mebibytes": 20}, timeout_s=60)
    assert result.is_error
    assert re.fullmatch(r"test: the server's reply was \d+\.\d MiB, more than the 16 MiB "
                        r"Pagoda reads of one reply: it was not read", result.text)
    assert await server_pid(hub) == pid
    assert (await hub.call_tool("test", "add", {"a": 1, "b": 1}, timeout_s=5)).text == "2"


async def test_a_json_reply_over_the_bound_from_a_url_server_is_refused_in_words(hub):
    result = await hub.call_tool("web", "big", {"mebibytes": 20}, timeout_s=60)
    assert result.is_error
    assert result.text == ("web: the server's reply was more than the 16 MiB Pagoda reads of "
                           "one reply: it was not read")
    assert (await hub.call_tool("web", "add", {"a": 1, "b": 1}, timeout_s=5)).text == "2"


async def test_a_call_over_its_time_limit_is_cancelled_and_the_next_call_works(hub):
    started = time.monotonic()
    with pytest.raises(ToolTimeoutError, match="test: the tool 'hang' did not finish within 0.5 s"):
        await hub.call_tool("test", "hang", {"seconds": 30}, timeout_s=0.5)
    assert time.monotonic() - started < 2.0
    assert (await hub.call_tool("test", "echo", {"text": "still here"}, timeout_s=5)).text == \
        "still here"


@pytest.mark.slow
async def test_a_server_hung_after_a_timeout_is_restarted_by_the_next_call(hub):
    hung_pid = await server_pid(hub)
    with pytest.raises(ToolTimeoutError):
        await hub.call_tool("test", "freeze", {"seconds": 60}, timeout_s=0.5)
    assert (await hub.call_tool("test", "echo", {"text": "again"}, timeout_s=5)).text == "again"
    assert await server_pid(hub) != hung_pid
    assert wait_gone(hung_pid, within_s=3)
    assert "restarting the server" in hub.log_text("test")


async def test_log_text_holds_what_the_server_wrote_on_stderr(hub):
    await hub.call_tool("test", "log", {"text": "cache warmed: 42 entries"}, timeout_s=5)
    deadline = time.monotonic() + 2
    while "cache warmed: 42 entries" not in hub.log_text("test"):
        assert time.monotonic() < deadline, hub.log_text("test")
        await asyncio.sleep(0.02)


async def test_a_command_that_does_not_exist_is_named(hub):
    with pytest.raises(ToolServerError, match="missing: the command 'no-such-mcp-server-command' "
                                              "was not found"):
        await hub.list_tools("missing")
    assert hub.status("missing").state == "failed"


async def test_a_server_that_exits_at_start_is_reported_with_its_last_log_line(hub):
    with pytest.raises(ToolServerError, match="exits: the server exited before it answered; its "
                                              "last log line: no API key given; set WEATHER_KEY"):
        await hub.call_tool("exits", "add", {"a": 1, "b": 2}, timeout_s=5)
    assert "no API key given" in hub.status("exits").message


async def test_a_server_that_crashes_is_reported_then_started_again(hub):
    pid = await server_pid(hub)
    psutil.Process(pid).kill()
    assert wait_gone(pid, within_s=3)
    with pytest.raises(ToolServerError, match="test: the server exited"):
        await hub.call_tool("test", "echo", {"text": "x"}, timeout_s=5)
    assert hub.status("test").state == "failed"
    assert (await hub.call_tool("test", "echo", {"text": "back"}, timeout_s=5)).text == "back"


async def test_disabled_and_unknown_servers_are_refused_in_words(hub):
    with pytest.raises(ToolServerError, match="off: the server is disabled"):
        await hub.list_tools("off")
    with pytest.raises(ToolServerError, match="ghost: no server has this name"):
        await hub.call_tool("ghost", "add", {}, timeout_s=5)
    assert hub.status("off").message == "disabled"


async def test_a_url_server_is_reached_over_streamable_http(hub):
    assert "add" in {tool.name for tool in await hub.list_tools("web")}
    assert (await hub.call_tool("web", "add", {"a": 20, "b": 22}, timeout_s=5)).text == "42"


async def test_an_sse_server_is_reached_too(hub):
    assert (await hub.call_tool("legacy", "echo", {"text": "old"}, timeout_s=5)).text == "old"


async def test_a_url_nobody_answers_is_named(hub):
    with pytest.raises(ToolServerError, match=r"nowhere: cannot connect to http://127\.0\.0\.1"):
        await hub.list_tools("nowhere")


async def test_enabled_tools_gather_every_catalog_and_name_the_failures(hub):
    enabled = await hub.enabled_tools()
    assert enabled.catalog.function_name("web", "add") == "web_add"
    assert enabled.catalog.function_name("test", "add") == "test_add"
    assert {failure.server for failure in enabled.failures} == {"missing", "exits", "nowhere"}


async def test_a_call_in_flight_leaves_the_callers_loop_free(hub):
    ticks = 0

    async def tick() -> None:
        nonlocal ticks
        while True:
            await asyncio.sleep(0.01)
            ticks += 1

    ticker = asyncio.ensure_future(tick())
    await hub.call_tool("test", "hang", {"seconds": 0.5}, timeout_s=5)
    ticker.cancel()
    assert ticks >= 20


def test_calls_from_several_threads_and_loops_at_once_are_answered(hub):
    answers: list[str] = []

    def caller(index: int) -> None:
        result = asyncio.run(hub.call_tool("test", "echo", {"text": str(index)}, timeout_s=10))
        answers.append(result.text)

    threads = [threading.Thread(target=caller, args=(index,)) for index in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(15)
    assert sorted(answers) == ["0", "1", "2", "3"]


async def test_close_with_a_call_in_flight_returns_quickly_and_kills_the_server():
    hub = McpHub(start_timeout_s=START_TIMEOUT_S)
    hub.configure([stdio_server()])
    pid = await server_pid(hub)
    frozen = asyncio.ensure_future(hub.call_tool("test", "freeze", {"seconds": 60}, timeout_s=60))
    await asyncio.sleep(0.3)
    started = time.monotonic()
    await asyncio.to_thread(hub.close)
    assert time.monotonic() - started < 3.0
    assert wait_gone(pid, within_s=1)
    with pytest.raises(ToolServerError, match="the server was stopped"):
        await frozen
    with pytest.raises(ToolServerError, match="shut down"):
        await hub.list_tools("test")


async def test_a_changed_server_is_restarted_and_a_removed_one_stopped():
    hub = McpHub(start_timeout_s=START_TIMEOUT_S)
    try:
        hub.configure([stdio_server()])
        first_pid = await server_pid(hub)
        hub.configure([stdio_server(GREETING="changed")])
        second_pid = await server_pid(hub)
        assert second_pid != first_pid
        assert await asyncio.to_thread(wait_gone, first_pid, 5)
        hub.configure([])
        assert await asyncio.to_thread(wait_gone, second_pid, 5)
        assert hub.status("test").message == "not configured"
    finally:
        hub.close()


async def test_a_server_silent_at_start_is_given_up_after_the_start_limit():
    script = "import sys, time; print('warming up', file=sys.stderr, flush=True); time.sleep(60)"
    silent = McpServerConfig("silent", command=sys.executable, args=("-c", script))
    hub = McpHub(start_timeout_s=1.0)
    try:
        hub.configure([silent])
        with pytest.raises(ToolServerError, match="silent: the server did not answer within 1 s "
                                                  "of starting; its last log line: warming up"):
            await hub.list_tools("silent")
        assert hub.status("silent").state == "failed"
    finally:
        hub.close()


async def test_a_caller_that_gives_up_leaves_the_server_usable(hub):
    waiting = asyncio.ensure_future(hub.call_tool("test", "hang", {"seconds": 30}, timeout_s=60))
    await asyncio.sleep(0.2)
    waiting.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiting
    assert (await hub.call_tool("test", "echo", {"text": "on"}, timeout_s=2)).text == "on"
