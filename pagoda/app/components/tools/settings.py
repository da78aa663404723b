"""Settings → Tools as a plain model: the MCP servers, how many calls a turn may make, how long
a call may run, and the tools the user always lets run. Kept in the store's settings, applied
to the hub. No Qt."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
from typing import Any

from pagoda.app.components.tools.config import McpServerConfig, mcp_servers_json, parse_mcp_servers
from pagoda.app.components.tools.errors import ToolConfigError

logger = logging.getLogger(__name__)

SETTING = "tools"
DEFAULT_MAX_CALLS = 8
MAX_CALLS_LIMIT = 64
DEFAULT_CALL_TIMEOUT_S = 120.0
CALL_TIMEOUT_RANGE_S = (1.0, 3600.0)
MAX_ALWAYS_ALLOWED = 1024


@dataclass(slots=True, frozen=True)
class ToolSettings:
    """What the user chose in Settings → Tools. `always_allowed` holds "server/tool" keys."""

    servers: tuple[McpServerConfig, ...] = ()
    max_calls_per_turn: int = DEFAULT_MAX_CALLS
    call_timeout_s: float = DEFAULT_CALL_TIMEOUT_S
    always_allowed: frozenset[str] = field(default_factory=frozenset)

    def __post_init__(self) -> None:
        if not 1 <= self.max_calls_per_turn <= MAX_CALLS_LIMIT:
            raise ToolConfigError(f"a turn may make 1 to {MAX_CALLS_LIMIT} tool calls, not "
                                  f"{self.max_calls_per_turn}")
        low, high = CALL_TIMEOUT_RANGE_S
        if not low <= self.call_timeout_s <= high:
            raise ToolConfigError(f"a tool call's time limit is {low:g} to {high:g} s, not "
                                  f"{self.call_timeout_s:g}")
        if len(self.always_allowed) > MAX_ALWAYS_ALLOWED:
            raise ToolConfigError(f"at most {MAX_ALWAYS_ALLOWED} tools can always run")

    def as_json(self) -> dict[str, Any]:
        """The stored form: the servers in the standard {"mcpServers": ...} text."""
        return {"mcpServers": mcp_servers_json(self.servers),
                "max_calls_per_turn": self.max_calls_per_turn,
                "call_timeout_s": self.call_timeout_s,
                "always_allowed": sorted(self.always_allowed)}


def settings_from(stored: Any) -> ToolSettings:
    """The stored settings; what cannot be read (another version's, a damaged value) is logged
    and left at its default, so the window still opens."""
    if not isinstance(stored, dict):
        return ToolSettings()
    values: dict[str, Any] = {}
    try:
        values["servers"] = tuple(parse_mcp_servers(stored.get("mcpServers") or "{}"))
    except ToolConfigError as exc:
        logger.warning("the stored MCP servers were not read: %s", exc)
    for key, kind in (("max_calls_per_turn", int), ("call_timeout_s", (int, float))):
        if isinstance(stored.get(key), kind) and not isinstance(stored.get(key), bool):
            values[key] = stored[key]
    allowed = stored.get("always_allowed")
    if isinstance(allowed, list) and all(isinstance(item, str) for item in allowed):
        values["always_allowed"] = frozenset(allowed)
    try:
        return ToolSettings(**values)
    except ToolConfigError as exc:
        logger.warning("the stored tool settings were not read: %s", exc)
        return ToolSettings()


class ToolSettingsModel:
    """The settings in force, saved with `save` (an async store call) and applied with
    `apply` (the hub's configure) whenever they change. Listeners hear of every change."""

    def __init__(self, save: Callable[[dict[str, Any]], Any],
                 apply: Callable[[Iterable[McpServerConfig]], None],
                 settings: ToolSettings | None = None) -> None:
        self._save = save
        self._apply = apply
        self.settings = settings or ToolSettings()
        self.listeners: list[Callable[[ToolSettings], None]] = []
        apply(self.settings.servers)

    def change(self, **changes: Any) -> ToolSettings:
        """New settings (ToolConfigError, in words, where they cannot be used): saved, applied
        to the hub, announced."""
        settings = replace(self.settings, **changes)
        names = [server.name for server in settings.servers]
        duplicated = sorted({name for name in names if names.count(name) > 1})
        if duplicated:
            raise ToolConfigError(f"two servers are named '{duplicated[0]}'; rename one")
        self._apply(settings.servers)
        self.settings = settings
        self._save(settings.as_json())
        for listener in list(self.listeners):
            listener(settings)
        return settings

    def add_servers(self, servers: Iterable[McpServerConfig]) -> ToolSettings:
        """Add servers (a pasted {"mcpServers": ...} for example); one with a name already in
        use replaces that one."""
        added = {server.name: server for server in servers}
        kept = [s for s in self.settings.servers if s.name not in added]
        return self.change(servers=(*kept, *added.values()))

    def remove_server(self, name: str) -> ToolSettings:
        return self.change(servers=tuple(s for s in self.settings.servers if s.name != name),
                           always_allowed=frozenset(
                               key for key in self.settings.always_allowed
                               if key.split("/", 1)[0] != name))

    def set_enabled(self, name: str, enabled: bool) -> ToolSettings:
        return self.change(servers=tuple(replace(s, enabled=enabled) if s.name == name else s
                                         for s in self.settings.servers))

    def allow_always(self, key: str) -> ToolSettings:
        return self.change(always_allowed=self.settings.always_allowed | {key})
