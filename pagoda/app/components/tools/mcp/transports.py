"""The transport for a configured server: our stdio_streams for a command (the SDK's
stdio_client reads long lines in quadratic time, and bounds none), the SDK's
streamable_http_client for a URL, sse_client for the older HTTP+SSE transport.

A stdio server's stderr goes to a StderrPipe, and its process is handed to the hub as soon as it
runs, so that the hub can kill a server that hangs at once rather than after the polite shutdown
(close stdin, wait 2 s, SIGTERM, wait 2 s, SIGKILL). A stdio server gets the SDK's short list of
inherited environment variables (HOME, LOGNAME, PATH, SHELL, TERM, USER; Windows' own on
Windows), as in Claude Desktop, and its configured `env` over them.
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Callable
from contextlib import AsyncExitStack, asynccontextmanager

import httpx2
import psutil
from mcp.client.sse import sse_client
from mcp.client.streamable_http import streamable_http_client

from pagoda.app.components.tools.config import McpServerConfig
from pagoda.app.components.tools.errors import ToolServerError
from pagoda.app.components.tools.mcp.bounded_http import BoundedReplies
from pagoda.app.components.tools.mcp.server_log import StderrPipe
from pagoda.app.components.tools.mcp.stdio_streams import stdio_streams

HTTP_CONNECT_TIMEOUT_S = 10.0
# A server may keep a response stream open and quiet for long; a call's own limit is the hub's.
HTTP_READ_TIMEOUT_S = 300.0


@asynccontextmanager
async def open_transport(config: McpServerConfig, stderr: StderrPipe | None,
                         note: Callable[[str], None],
                         on_process: Callable[[psutil.Process | None], None]
                         ) -> AsyncIterator[tuple]:
    """The read and write streams of a connection to `config`'s server, for mcp.Client. A stdio
    server writes its stderr into `stderr` (needed then), `note` adds a line to its log (what
    it wrote that was not read), and `on_process` hears of its process as soon as it runs."""
    if config.transport == "stdio":
        assert stderr is not None, "a stdio server needs a pipe for its stderr"
        async with _stdio(config, stderr, note, on_process) as streams:
            yield streams
    elif config.transport == "http":
        timeout = httpx2.Timeout(HTTP_CONNECT_TIMEOUT_S, read=HTTP_READ_TIMEOUT_S)
        async with (httpx2.AsyncClient(headers=config.headers, timeout=timeout,
                                       transport=BoundedReplies()) as http,
                    streamable_http_client(config.url, http_client=http) as streams):
            yield streams
    else:
        async with sse_client(config.url, headers=config.headers, timeout=HTTP_CONNECT_TIMEOUT_S,
                              sse_read_timeout=HTTP_READ_TIMEOUT_S) as streams:
            yield streams


@asynccontextmanager
async def _stdio(config: McpServerConfig, pipe: StderrPipe, note: Callable[[str], None],
                 on_process: Callable[[psutil.Process | None], None]) -> AsyncIterator[tuple]:
    async with AsyncExitStack() as stack:
        try:
            if config.cwd is not None and not os.path.isdir(config.cwd):
                raise ToolServerError(config.name, f"the folder '{config.cwd}' (its 'cwd') "
                                                   "does not exist")
            streams = await stack.enter_async_context(stdio_streams(
                config, pipe.writer, note, lambda pid: on_process(_process(pid))))
        finally:
            pipe.close_writer()
        yield streams


def _process(pid: int) -> psutil.Process | None:
    try:
        return psutil.Process(pid)
    except psutil.Error:
        return None  # it has gone already: there is nothing to kill
