"""One chat's tools from the MCP servers: the functions its selectors ("server",
"server/tool") choose, under names the model calls, and its calls, run through the hub. It is
the ChatTools a ChatSession takes (pagoda/app/components/shared/tool_seam.py)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any, Protocol

from pagoda.app.components.shared.tool_seam import ToolOffer, ToolOutcome
from pagoda.app.components.tools.catalog import McpTool, ToolCatalog
from pagoda.app.components.tools.data import ToolResult
from pagoda.app.components.tools.errors import ToolError
from pagoda.app.components.tools.hub import gather_tools
from pagoda.app.components.tools.settings import ToolSettingsModel


class ToolServers(Protocol):
    """What a chat's tools need of the hub (McpHub has it)."""

    async def list_tools(self, server: str) -> list[McpTool]: ...

    async def call_tool(self, server: str, tool: str, arguments: dict[str, Any],
                        timeout_s: float) -> ToolResult: ...


class McpChatTools:
    """The tools of one chat. `offer` lists the chosen servers' tools (starting them) and keeps
    the names it gave, so `call` and `server_of` read the model's calls by them."""

    def __init__(self, hub: ToolServers, settings: ToolSettingsModel) -> None:
        self._hub = hub
        self._settings = settings
        self._catalog = ToolCatalog(())

    @property
    def max_calls_per_turn(self) -> int:
        return self._settings.settings.max_calls_per_turn

    async def offer(self, selectors: Sequence[str]) -> ToolOffer:
        tools, failures = await gather_tools(self._hub.list_tools,
                                             self._chosen_servers(selectors))
        self._catalog = ToolCatalog(tool for tool in tools if _chosen(tool, selectors))
        return ToolOffer(self._catalog.specs(), tuple(str(failure) for failure in failures))

    def _chosen_servers(self, selectors: Sequence[str]) -> list[str]:
        wanted = {selector.split("/", 1)[0] for selector in selectors}
        return [s.name for s in self._settings.settings.servers if s.enabled and s.name in wanted]

    def server_of(self, name: str) -> str | None:
        tool = self._tool(name)
        return tool.server if tool is not None else None

    def always_allowed(self, name: str) -> bool:
        tool = self._tool(name)
        return tool is not None and _key(tool) in self._settings.settings.always_allowed

    def allow_always(self, name: str) -> None:
        tool = self._tool(name)
        if tool is not None:
            self._settings.allow_always(_key(tool))

    async def call(self, name: str, arguments: str) -> ToolOutcome:
        try:
            tool = self._catalog.resolve(name)
            result = await self._hub.call_tool(tool.server, tool.name, _arguments(arguments),
                                               self._settings.settings.call_timeout_s)
        except ToolError as exc:
            return ToolOutcome("failed", str(exc))
        return ToolOutcome("failed" if result.is_error else "done", result.text)

    def _tool(self, name: str) -> McpTool | None:
        try:
            return self._catalog.resolve(name)
        except ToolError:
            return None


class BadArgumentsError(ToolError):
    """The model wrote arguments that are not a JSON object."""


def _arguments(text: str) -> dict:
    try:
        value = json.loads(text or "{}")
    except ValueError as exc:
        raise BadArgumentsError(f"the arguments are not JSON ({exc}): {text[:200]}") from None
    if not isinstance(value, dict):
        raise BadArgumentsError(f"the arguments must be a JSON object, not {text[:200]}")
    return value


def _chosen(tool: McpTool, selectors: Sequence[str]) -> bool:
    return tool.server in selectors or _key(tool) in selectors


def _key(tool: McpTool) -> str:
    return f"{tool.server}/{tool.name}"
