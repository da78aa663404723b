"""One configured MCP server's session, on the hub's event loop.

The server starts on first use, and its mcp.Client lives in a task of its own (the SDK's task
groups must be entered and left by one task) until stop(). A call over its time limit is
cancelled at the server; the next call first asks for the tool list, and a server that does not
answer within PROBE_TIMEOUT_S is killed and started again. A server that exited or closed its
connection is "failed" until the next call starts it again.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import mcp.types as mcp_types
import psutil
from mcp import Client, MCPError

from pagoda import __version__
from pagoda.app.components.tools.catalog import McpTool
from pagoda.app.components.tools.config import McpServerConfig
from pagoda.app.components.tools.data import ServerStatus, ToolResult
from pagoda.app.components.tools.errors import ToolServerError, ToolTimeoutError
from pagoda.app.components.tools.mcp.failures import describe_failure, is_connection_closed
from pagoda.app.components.tools.mcp.results import bounded_text, tool_result
from pagoda.app.components.tools.mcp.server_log import STARTING, LogRing, StderrPipe
from pagoda.app.components.tools.mcp.stdio_streams import REPLY_TOO_LARGE
from pagoda.app.components.tools.mcp.transports import open_transport

logger = logging.getLogger(__name__)

STOP_GRACE_S = 2.0      # for a server to leave after its stdin closes, before it is killed
KILL_WAIT_S = 2.0       # for the SDK to see a killed server go
PROBE_TIMEOUT_S = 2.0   # for a server whose last call timed out to list its tools
STDERR_DRAIN_S = 1.0    # for the last lines of an exited server to reach its log
MAX_TOOL_PAGES = 100
STOPPED = "the server was stopped (its settings changed, or Pagoda is closing)"
CLIENT_INFO = mcp_types.Implementation(name="pagoda", version=__version__)


class McpConnection:
    """A server's session: list_tools and call_tool start it when needed; stop() ends it."""

    def __init__(self, config: McpServerConfig, log: LogRing, start_timeout_s: float) -> None:
        self.config = config
        self.status = ServerStatus("stopped")
        self._log = log
        self._start_timeout_s = start_timeout_s
        self._client: Client | None = None
        self._runner: asyncio.Task | None = None
        self._ready: asyncio.Future[Client] | None = None
        self._closing: asyncio.Event | None = None
        self._starting: asyncio.Task | None = None
        self._failing: asyncio.Task | None = None
        self._process: psutil.Process | None = None
        self._stderr: StderrPipe | None = None
        self._tools: list[McpTool] | None = None
        self._suspect = False
        self._stop_requested = False

    @property
    def name(self) -> str:
        return self.config.name

    async def list_tools(self) -> list[McpTool]:
        """The server's tools, asked for once per session (again when it says they changed)."""
        client = await self._running_client()
        if self._tools is None:
            try:
                async with asyncio.timeout(self._start_timeout_s):
                    self._tools = await self._fetch_tools(client)
            except TimeoutError:
                raise await self._fail(ToolServerError(
                    self.name, f"the server did not list its tools within "
                               f"{self._start_timeout_s:g} s"), client) from None
            except Exception as exc:  # noqa: BLE001 - said in the ToolServerError
                raise await self._fail(exc, client) from None
        return list(self._tools)

    async def call_tool(self, tool: str, arguments: dict[str, Any],
                        timeout_s: float) -> ToolResult:
        """Run `tool`; a JSON-RPC error in answer (an unknown tool, arguments the server refused)
        is a ToolResult with is_error, which the model can read and correct."""
        client = await self._running_client()
        deadline = asyncio.timeout(timeout_s)
        try:
            async with deadline:
                result = await client.call_tool(tool, arguments)
        except TimeoutError:
            if not deadline.expired():
                raise
            self._suspect = True
            raise ToolTimeoutError(self.name, tool, timeout_s) from None
        except MCPError as exc:
            if is_connection_closed(exc):
                raise await self._fail(exc, client) from None
            said = exc.message if exc.data == REPLY_TOO_LARGE \
                else f"the server refused the call: {exc.message}"
            return ToolResult(bounded_text(f"{self.name}: {said}"), is_error=True)
        except Exception as exc:
            self._suspect = True
            raise ToolServerError(self.name, describe_failure(
                self.config, exc, "", starting=False)) from exc
        return tool_result(result)

    async def stop(self, grace_s: float = STOP_GRACE_S) -> None:
        """End the session: the server gets `grace_s` to leave after its stdin closes, then is
        killed. Calls in flight raise ToolServerError saying the server was stopped."""
        self._stop_requested = True
        try:
            await self._end_session(grace_s)
        finally:
            self._stop_requested = False
        if self.status.state != "failed":
            self.status = ServerStatus("stopped")

    def kill(self) -> None:
        """Kill the server's process and its children now (a stdio server; no-op otherwise)."""
        process = self._process
        if process is None:
            return
        try:
            family = [*process.children(recursive=True), process]
        except psutil.Error:
            family = [process]
        for member in family:
            try:
                member.kill()
            except psutil.Error:
                continue

    async def _running_client(self) -> Client:
        if self._suspect:
            self._suspect = False
            await self._restart_if_hung()
        if self._client is not None:
            return self._client
        if self._starting is None:
            self._starting = asyncio.ensure_future(self._start())
            self._starting.add_done_callback(self._started)
        return await asyncio.shield(self._starting)

    def _started(self, task: asyncio.Task) -> None:
        self._starting = None
        if not task.cancelled():
            task.exception()  # retrieved here: every waiter may have gone

    async def _start(self) -> Client:
        self.status = ServerStatus("starting")
        self._closing = asyncio.Event()
        self._ready = asyncio.get_running_loop().create_future()
        if self.config.transport == "stdio":
            self._log.note(f"{STARTING} '{self.config.command}' with "
                           f"{len(self.config.args)} arguments")
            self._stderr = StderrPipe(self._log, self.name)
        self._runner = asyncio.create_task(self._serve(self._ready, self._closing),
                                           name=f"mcp server {self.name}")
        try:
            async with asyncio.timeout(self._start_timeout_s):
                client = await asyncio.shield(self._ready)
        except TimeoutError:
            raise await self._fail(ToolServerError(
                self.name, f"the server did not answer within {self._start_timeout_s:g} s of "
                           f"starting{self._log_clause()}"), None) from None
        except Exception as exc:  # noqa: BLE001 - said in the ToolServerError
            raise await self._fail(exc, None, starting=True) from None
        self._client = client
        self._tools = None
        self.status = ServerStatus("running")
        return client

    async def _serve(self, ready: asyncio.Future[Client], closing: asyncio.Event) -> None:
        """The task that holds the session open, from the spawn to stop() or a failure."""
        transport = open_transport(self.config, self._stderr, self._log.note,
                                   self._set_process)
        client = Client(transport, client_info=CLIENT_INFO, cache=None,
                        message_handler=self._on_message)
        try:
            async with client:
                ready.set_result(client)
                await closing.wait()
        except Exception as exc:  # noqa: BLE001 - handed to the starter, or logged
            if not ready.done():
                ready.set_exception(exc)
            else:
                logger.info("MCP server %r ended: %s", self.name, exc)
        finally:
            if not ready.done():
                ready.set_exception(ToolServerError(self.name, STOPPED))
            self._process = None
            self._log.note("[pagoda] stopped")

    def _set_process(self, process: psutil.Process | None) -> None:
        self._process = process

    async def _on_message(self, message: Any) -> None:
        if isinstance(message, mcp_types.ToolListChangedNotification):
            self._tools = None

    async def _fetch_tools(self, client: Client) -> list[McpTool]:
        tools: list[McpTool] = []
        cursor = None
        for _ in range(MAX_TOOL_PAGES):
            page = await client.list_tools(cursor=cursor)
            tools.extend(McpTool(self.name, tool.name, tool.description or "",
                                 dict(tool.input_schema), tool.title or "")
                         for tool in page.tools)
            cursor = page.next_cursor
            if cursor is None:
                return tools
        raise ToolServerError(self.name, f"the server lists its tools in more than "
                                         f"{MAX_TOOL_PAGES} pages")

    async def _restart_if_hung(self) -> None:
        """After a timed-out call: keep the server if it still answers, else end its session
        (the caller starts a new one)."""
        client = self._client
        if client is None:
            return
        try:
            async with asyncio.timeout(PROBE_TIMEOUT_S):
                await client.list_tools()
        except Exception:  # noqa: BLE001 - any failure to answer is taken for a hang
            self._log.note(f"[pagoda] no answer within {PROBE_TIMEOUT_S:g} s after a call timed "
                           "out: restarting the server")
            self.kill()
            await self._end_session(0.0)

    async def _fail(self, exc: BaseException, client: Client | None, *,
                    starting: bool = False) -> ToolServerError:
        """The error to raise after `exc` ended the session of `client` (None: the session
        being started), which is torn down once however many calls see it end."""
        if self._stop_requested:
            return ToolServerError(self.name, STOPPED)
        if client is not None and client is not self._client:
            return ToolServerError(self.name, self.status.message or STOPPED)
        if self._failing is None:
            self._failing = asyncio.ensure_future(self._tear_down(exc, starting))
        return await asyncio.shield(self._failing)

    async def _tear_down(self, exc: BaseException, starting: bool) -> ToolServerError:
        try:
            self.kill()
            await self._end_session(0.0)
            if self._stderr is not None:
                await asyncio.to_thread(self._stderr.join, STDERR_DRAIN_S)
            message = describe_failure(self.config, exc, self._log.last_line(),
                                       starting=starting)
            self.status = ServerStatus("failed", message)
            self._log.note(f"[pagoda] failed: {message}")
            return ToolServerError(self.name, message)
        finally:
            self._failing = None

    async def _end_session(self, grace_s: float) -> None:
        runner = self._runner
        if runner is not None:
            if self._ready is not None and not self._ready.done():
                grace_s = 0.0  # still starting: nothing to be polite to
            assert self._closing is not None
            self._closing.set()
            if not (await asyncio.wait({runner}, timeout=grace_s))[0]:
                self.kill()
                if not (await asyncio.wait({runner}, timeout=KILL_WAIT_S))[0]:
                    runner.cancel()
                    await asyncio.wait({runner}, timeout=KILL_WAIT_S)
        self._client = None
        self._runner = None
        self._ready = None
        self._tools = None

    def _log_clause(self) -> str:
        line = self._log.last_line()
        return f"; its last log line: {line}" if line else ""
