"""The window's tools as one plain model: Settings → Tools (kept in the store), the MCP hub
(made on first use, so a window whose chats use no tools starts no thread for them), each
chat's ChatTools, and the servers as the chat settings show them. No Qt."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable

from pagoda.app.components.shared.async_store import AsyncStore
from pagoda.app.components.shared.view_models import ToolServerView
from pagoda.app.components.tools.catalog import McpTool
from pagoda.app.components.tools.chat_tools import McpChatTools
from pagoda.app.components.tools.config import McpServerConfig
from pagoda.app.components.tools.data import ServerStatus
from pagoda.app.components.tools.errors import ToolServerError
from pagoda.app.components.tools.hub import McpHub
from pagoda.app.components.tools.settings import SETTING, ToolSettingsModel, settings_from

logger = logging.getLogger(__name__)


class Toolbox:
    """`settings` (a ToolSettingsModel), `for_chat()` for each ChatSession, `server_views()`
    for the chats' settings, `list_tools(server)` to read a server's tools (starting it),
    `status`/`log_text` per server, `close()` on quit. `on_changed()` fires when servers,
    their tools or their states change."""

    def __init__(self, db: AsyncStore, hub_factory: Callable[[], McpHub] = McpHub) -> None:
        self._db = db
        self._hub_factory = hub_factory
        self._hub: McpHub | None = None
        self._tools: dict[str, list[McpTool]] = {}  # each server's tools, once listed
        self._closed = False
        self.on_changed: Callable[[], None] = lambda: None
        self.settings = ToolSettingsModel(self._save, self._apply)
        self.settings.listeners.append(lambda _settings: self._changed())

    async def load(self) -> None:
        """The settings kept in the store (applied to the hub once it is made)."""
        stored = await self._db.get_setting(SETTING, None)
        loaded = settings_from(stored)
        if loaded != self.settings.settings:
            self.settings.settings = loaded
            self._changed()

    @property
    def hub(self) -> McpHub:
        if self._hub is None:
            if self._closed:
                raise ToolServerError("tools", "Pagoda is closing")
            self._hub = self._hub_factory()
            self._hub.configure(self.settings.settings.servers)
        return self._hub

    def for_chat(self) -> McpChatTools:
        return McpChatTools(_LazyHub(self), self.settings)

    async def list_tools(self, server: str) -> list[McpTool]:
        """The tools of `server`, started if need be (ToolServerError when it cannot be)."""
        try:
            tools = await self.hub.list_tools(server)
        finally:
            self._changed()
        self._tools[server] = tools
        self._changed()
        return tools

    def status(self, server: str) -> ServerStatus:
        if self._hub is None:
            return ServerStatus("stopped")
        return self._hub.status(server)

    def log_text(self, server: str) -> str:
        return self._hub.log_text(server) if self._hub is not None else ""

    def server_views(self) -> list[ToolServerView]:
        """The enabled servers, with the tools read from them so far and their state."""
        return [ToolServerView(config.name,
                               tuple((t.name, t.description) for t in self._tools.get(
                                   config.name, [])),
                               _state_words(self.status(config.name)))
                for config in self.settings.settings.servers if config.enabled]

    def close(self) -> None:
        self._closed = True
        if self._hub is not None:
            self._hub.close()

    def _save(self, value: dict) -> None:
        self._db.submit(lambda store: store.set_setting(SETTING, value))

    def _apply(self, servers: Iterable[McpServerConfig]) -> None:
        servers = tuple(servers)
        names = {server.name for server in servers}
        self._tools = {name: tools for name, tools in self._tools.items() if name in names}
        if self._hub is not None:
            self._hub.configure(servers)

    def _changed(self) -> None:
        self.on_changed()


class _LazyHub:
    """The hub, made when a chat first needs it."""

    def __init__(self, toolbox: Toolbox) -> None:
        self._toolbox = toolbox

    async def list_tools(self, server: str) -> list[McpTool]:
        return await self._toolbox.list_tools(server)

    async def call_tool(self, server: str, tool: str, arguments: dict, timeout_s: float):
        return await self._toolbox.hub.call_tool(server, tool, arguments, timeout_s)


def _state_words(status: ServerStatus) -> str:
    if status.state == "failed":
        return f"failed: {status.message}" if status.message else "failed"
    return {"stopped": "", "starting": "starting", "running": "running"}[status.state]

