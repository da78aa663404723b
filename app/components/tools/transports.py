"""The SDK transport for a configured server: stdio_client for a command, streamable_http_client
for a URL, sse_client for the older HTTP+SSE transport.

A stdio server's stderr goes to a StderrPipe, and its process is found among this process's
children right after the spawn (the SDK does not hand it out), so that the hub can kill a server
that hangs at once rather than after the SDK's polite shutdown (close stdin, wait 2 s, SIGTERM,
wait 2 s, SIGKILL). A stdio server gets the SDK's short list of inherited environment variables
(HOME, LOGNAME, PATH, SHELL, TERM, USER; Windows' own on Windows), as in Claude Desktop, and its
configured `env` over them.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator, Callable
from contextlib import AsyncExitStack, asynccontextmanager

import httpx2
import psutil
from mcp.client.sse import sse_client
from mcp.client.stdio import StdioServerParameters, stdio_client
from mcp.client.streamable_http import streamable_http_client

from app.components.tools.config import McpServerConfig
from app.components.tools.errors import ToolServerError
from app.components.tools.server_log import StderrPipe

HTTP_CONNECT_TIMEOUT_S = 10.0
# A server may keep a response stream open and quiet for long; a call's own limit is the hub's.
HTTP_READ_TIMEOUT_S = 300.0


@asynccontextmanager
async def open_transport(config: McpServerConfig, stderr: StderrPipe | None,
                         spawn_lock: asyncio.Lock,
                         on_process: Callable[[psutil.Process | None], None]
                         ) -> AsyncIterator[tuple]:
    """The read and write streams of a connection to `config`'s server, for mcp.Client. A stdio
    server writes its stderr into `stderr` (needed then), and `on_process` hears of its process
    as soon as it is started."""
    if config.transport == "stdio":
        assert stderr is not None, "a stdio server needs a pipe for its stderr"
        async with _stdio_streams(config, stderr, spawn_lock, on_process) as streams:
            yield streams
    elif config.transport == "http":
        timeout = httpx2.Timeout(HTTP_CONNECT_TIMEOUT_S, read=HTTP_READ_TIMEOUT_S)
        async with (httpx2.AsyncClient(headers=config.headers, timeout=timeout) as http,
                    streamable_http_client(config.url, http_client=http) as streams):
            yield streams
    else:
        async with sse_client(config.url, headers=config.headers, timeout=HTTP_CONNECT_TIMEOUT_S,
                              sse_read_timeout=HTTP_READ_TIMEOUT_S) as streams:
            yield streams


@asynccontextmanager
async def _stdio_streams(config: McpServerConfig, pipe: StderrPipe, spawn_lock: asyncio.Lock,
                         on_process: Callable[[psutil.Process | None], None]
                         ) -> AsyncIterator[tuple]:
    params = StdioServerParameters(command=config.command, args=list(config.args),
                                   env=dict(config.env) or None, cwd=config.cwd)
    async with AsyncExitStack() as stack:
        try:
            if config.cwd is not None and not os.path.isdir(config.cwd):
                raise ToolServerError(config.name, f"the folder '{config.cwd}' (its 'cwd') "
                                                   "does not exist")
            async with spawn_lock:
                before = _child_pids()
                streams = await stack.enter_async_context(stdio_client(params, errlog=pipe.writer))
                on_process(_new_child(before, config.args))
        finally:
            pipe.close_writer()
        yield streams


def _child_pids() -> set[int]:
    return {child.pid for child in psutil.Process().children()}


def _new_child(before: set[int], args: tuple[str, ...]) -> psutil.Process | None:
    """The server just spawned: a child that was not there before, leads its own session (the
    SDK starts servers so), and whose command line ends with the configured arguments."""
    for child in psutil.Process().children():
        if child.pid in before:
            continue
        try:
            leads_session = not hasattr(os, "getsid") or os.getsid(child.pid) == child.pid
            if leads_session and (not args or tuple(child.cmdline()[-len(args):]) == args):
                return child
        except (psutil.Error, OSError):
            continue
    return None
