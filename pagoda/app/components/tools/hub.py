"""The MCP servers of the window, on a thread of their own.

McpHub owns one daemon thread, "pagoda-mcp", running an asyncio event loop on which every server
session lives, so the GUI's loop (qasync) never waits on a server. Its async methods can be
awaited from any other event loop: each runs on the hub's loop (asyncio.run_coroutine_threadsafe)
and is awaited through asyncio.wrap_future; cancelling the awaiting task cancels the work on the
hub's loop, and a call in flight at the server. configure, status, log_text and close are plain
methods for any thread (the GUI's).

Servers start on first use (list_tools, call_tool). The SDK is imported on the hub's thread when
it starts, so constructing an McpHub costs the GUI thread nothing (`import mcp` takes about a
second).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import threading
from collections.abc import Awaitable, Callable, Coroutine, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

from pagoda.app.components.tools.catalog import McpTool, ToolCatalog
from pagoda.app.components.tools.config import McpServerConfig
from pagoda.app.components.tools.data import ServerStatus, ToolResult
from pagoda.app.components.tools.errors import ToolConfigError, ToolServerError
from pagoda.app.components.tools.mcp.server_log import LogRing

if TYPE_CHECKING:
    from pagoda.app.components.tools.mcp.connection import McpConnection

logger = logging.getLogger(__name__)

T = TypeVar("T")

THREAD_NAME = "pagoda-mcp"
# npx and uvx may download a server's package the first time it starts.
DEFAULT_START_TIMEOUT_S = 60.0
CLOSE_GRACE_S = 1.0     # on quit, for a server to leave after its stdin closes
CLOSE_TIMEOUT_S = 5.0
NOT_CONFIGURED = "no server has this name in Settings → Tools"
DISABLED = "the server is disabled in Settings → Tools"
SHUT_DOWN = "the tool servers are shut down (Pagoda is closing)"


@dataclass(frozen=True, slots=True)
class EnabledTools:
    """The tools of every enabled server that listed them, and why the others did not."""

    catalog: ToolCatalog
    failures: tuple[ToolServerError, ...] = ()


async def gather_tools(list_tools: Callable[[str], Awaitable[list[McpTool]]],
                       servers: Iterable[str]) -> tuple[list[McpTool], tuple[ToolServerError, ...]]:
    """The tools of these servers, listed at once, and the failures of those that cannot be
    used (any other exception is raised)."""
    listed = await asyncio.gather(*(list_tools(name) for name in servers),
                                  return_exceptions=True)
    tools: list[McpTool] = []
    failures: list[ToolServerError] = []
    for outcome in listed:
        if isinstance(outcome, ToolServerError):
            failures.append(outcome)
        elif isinstance(outcome, BaseException):
            raise outcome
        else:
            tools.extend(outcome)
    return tools, tuple(failures)


class McpHub:
    """The configured MCP servers: their tools, calls to them, their status and logs."""

    def __init__(self, *, start_timeout_s: float = DEFAULT_START_TIMEOUT_S) -> None:
        self._start_timeout_s = start_timeout_s
        self._lock = threading.Lock()  # guards _configs, _logs and _closed
        self._configs: dict[str, McpServerConfig] = {}
        self._logs: dict[str, LogRing] = {}
        self._closed = False
        self._connections: dict[str, McpConnection] = {}  # touched on the hub's loop only
        self._stopping: set[asyncio.Task] = set()
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._run_loop, name=THREAD_NAME, daemon=True)
        self._thread.start()

    def configure(self, configs: Iterable[McpServerConfig]) -> None:
        """Use these servers from now on. A server removed, changed or disabled is stopped (in
        the background); a new one starts on first use. Returns at once."""
        by_name: dict[str, McpServerConfig] = {}
        for config in configs:
            if config.name in by_name:
                raise ToolConfigError(f"two servers are named '{config.name}'; rename one")
            by_name[config.name] = config
        with self._lock:
            if self._closed:
                return
            self._configs = by_name
            self._logs = {name: self._logs.get(name) or LogRing() for name in by_name}
            # Under the lock: close() cannot have closed the loop yet.
            self._loop.call_soon_threadsafe(self._drop_stale_connections)

    def configs(self) -> list[McpServerConfig]:
        """The servers configured, in the order given."""
        with self._lock:
            return list(self._configs.values())

    async def list_tools(self, server: str) -> list[McpTool]:
        """The tools of `server`, started if it is not running; listed once per session.
        Raises ToolServerError when the server cannot be used."""
        return await self._on_hub(server, self._list_tools(server))

    async def call_tool(self, server: str, tool: str, arguments: dict[str, Any],
                        timeout_s: float) -> ToolResult:
        """Call `tool` of `server` with `arguments`, started if it is not running.

        A tool that reports a failure, or a JSON-RPC error in answer, gives a ToolResult with
        is_error. Raises ToolTimeoutError after `timeout_s` (the call is cancelled at the
        server; a server that then does not answer is restarted by the next call), and
        ToolServerError when the server cannot be used (its start has its own time limit)."""
        return await self._on_hub(server, self._call_tool(server, tool, arguments, timeout_s))

    async def enabled_tools(self) -> EnabledTools:
        """The catalog of the tools of every enabled server, listed at once; a server that
        cannot be used is left out and named in `failures`."""
        names = [config.name for config in self.configs() if config.enabled]
        tools, failures = await gather_tools(self.list_tools, names)
        return EnabledTools(ToolCatalog(tools), failures)

    def status(self, server: str) -> ServerStatus:
        """Where `server` stands now (any thread)."""
        with self._lock:
            config = self._configs.get(server)
        if config is None:
            return ServerStatus("stopped", "not configured")
        if not config.enabled:
            return ServerStatus("stopped", "disabled")
        connection = self._connections.get(server)
        if connection is None or connection.config != config:
            return ServerStatus("stopped")
        return connection.status

    def log_text(self, server: str) -> str:
        """What `server` wrote on stderr lately (its last 2,000 lines, 256 Ki characters at
        most), with Pagoda's own lines ("[pagoda] starting ..."); "" for a server not
        configured. Kept across restarts and changes of its configuration."""
        with self._lock:
            ring = self._logs.get(server)
        return ring.text() if ring is not None else ""

    def close(self, timeout_s: float = CLOSE_TIMEOUT_S) -> None:
        """Stop every server and the hub's thread, within about `timeout_s` even when a server
        hangs: one that has not left CLOSE_GRACE_S after its stdin closed is killed. Calls in
        flight raise ToolServerError. Idempotent; not from the hub's own thread."""
        if threading.current_thread() is self._thread:
            raise RuntimeError("McpHub.close() was called from the hub's own thread")
        with self._lock:
            if self._closed:
                return
            self._closed = True
        connections = list(self._connections.copy().values())
        shut_down = asyncio.run_coroutine_threadsafe(self._shut_down(), self._loop)
        try:
            shut_down.result(timeout_s)
        except concurrent.futures.TimeoutError:
            logger.warning("MCP servers did not stop within %.1f s; killing them", timeout_s)
            for connection in connections:
                connection.kill()
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout_s)

    async def _on_hub(self, server: str, work: Coroutine[Any, Any, T]) -> T:
        with self._lock:
            # Under the lock: close() cannot have closed the loop yet.
            running = None if self._closed else asyncio.run_coroutine_threadsafe(work, self._loop)
        if running is None:
            work.close()
            raise ToolServerError(server, SHUT_DOWN)
        return await asyncio.wrap_future(running)

    async def _list_tools(self, server: str) -> list[McpTool]:
        return await self._connection(server).list_tools()

    async def _call_tool(self, server: str, tool: str, arguments: dict[str, Any],
                         timeout_s: float) -> ToolResult:
        if not isinstance(arguments, dict):
            return ToolResult(f"{server}: the arguments of '{tool}' must be a JSON object, not "
                              f"{type(arguments).__name__}", is_error=True)
        return await self._connection(server).call_tool(tool, arguments, timeout_s)

    def _connection(self, server: str) -> McpConnection:
        """The connection for `server`'s current configuration (hub's loop)."""
        from pagoda.app.components.tools.mcp.connection import McpConnection

        self._drop_stale_connections()
        with self._lock:
            closed = self._closed
            config = self._configs.get(server)
            log = self._logs.get(server)
        if closed:
            raise ToolServerError(server, SHUT_DOWN)
        if config is None or log is None:
            raise ToolServerError(server, NOT_CONFIGURED)
        if not config.enabled:
            raise ToolServerError(server, DISABLED)
        connection = self._connections.get(server)
        if connection is None:
            connection = McpConnection(config, log, self._start_timeout_s)
            self._connections[server] = connection
        return connection

    def _drop_stale_connections(self) -> None:
        """Stop the connections whose server was removed, changed or disabled (hub's loop)."""
        with self._lock:
            configs = dict(self._configs)
        for name, connection in list(self._connections.items()):
            if configs.get(name) != connection.config:
                del self._connections[name]
                task = self._loop.create_task(connection.stop())
                self._stopping.add(task)
                task.add_done_callback(self._stopping.discard)

    async def _shut_down(self) -> None:
        connections = list(self._connections.values())
        self._connections.clear()
        await asyncio.gather(*(connection.stop(CLOSE_GRACE_S) for connection in connections),
                             *self._stopping, return_exceptions=True)
        others = [task for task in asyncio.all_tasks() if task is not asyncio.current_task()]
        for task in others:
            task.cancel()
        if others:
            await asyncio.wait(others, timeout=CLOSE_GRACE_S)

    def _run_loop(self) -> None:
        try:
            # Loaded here, off the caller's thread: the SDK takes about a second to import.
            import pagoda.app.components.tools.mcp.connection  # noqa: F401
        except ImportError:
            logger.exception("The MCP SDK cannot be imported; every tool call will fail")
        asyncio.set_event_loop(self._loop)
        try:
            self._loop.run_forever()
        finally:
            self._loop.run_until_complete(self._loop.shutdown_default_executor())
            self._loop.close()
