"""What the Settings → Tools dialog shows and reads, as plain data: a server's row (its
transport and state in words), the add-server form turned into an McpServerConfig, a pasted or
imported {"mcpServers": ...} document and what adding it replaced, and the tools each server
listed, or why it could not. No Qt: the dialog renders these and forwards what the user does.
"""

from __future__ import annotations

import shlex
from collections.abc import Awaitable, Callable, Collection, Coroutine, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from pagoda.app.components.shared.bounded_files import FileTooLargeError, read_utf8
from pagoda.app.components.tools.catalog import McpTool
from pagoda.app.components.tools.config import MAX_TEXT_BYTES, McpServerConfig, mcp_servers_json
from pagoda.app.components.tools.data import ServerStatus
from pagoda.app.components.tools.errors import ToolConfigError, ToolError, ToolServerError

FormTransport = Literal["command", "url"]


@dataclass(slots=True, frozen=True)
class ServerRow:
    """One line of the servers list."""

    name: str
    transport: str  # the command line, or the URL
    enabled: bool
    state: str


def server_rows(servers: Iterable[McpServerConfig],
                status_of: Callable[[str], ServerStatus]) -> list[ServerRow]:
    return [ServerRow(config.name, transport_words(config), config.enabled,
                      state_words(status_of(config.name)) if config.enabled else "disabled")
            for config in servers]


def transport_words(config: McpServerConfig) -> str:
    """The command line a stdio server is started with, or the URL it is reached at."""
    if config.transport == "stdio":
        return shlex.join((config.command, *config.args))
    return f"{config.url} (SSE)" if config.transport == "sse" else config.url


def state_words(status: ServerStatus) -> str:
    """"stopped", "starting…", "running", "failed: why"; a stopped server's reason in brackets."""
    words = {"stopped": "stopped", "starting": "starting…", "running": "running",
             "failed": "failed"}[status.state]
    if not status.message:
        return words
    if status.state == "failed":
        return f"failed: {status.message}"
    return f"{words} ({status.message})"


# The add-server form ----------------------------------------------------------------------------

@dataclass(slots=True, frozen=True)
class ServerForm:
    """The fields of "Add server…" as typed: a name and either a command line with KEY=VALUE
    environment lines, or a URL with "Name: value" header lines."""

    name: str
    transport: FormTransport
    command_line: str = ""
    env_lines: str = ""
    url: str = ""
    header_lines: str = ""


def server_from_form(form: ServerForm, taken: Collection[str] = ()) -> McpServerConfig:
    """The server the form describes; ToolConfigError, naming the field, where it cannot be
    one, or where `taken` (the servers' names so far) already holds its name."""
    name = form.name.strip()
    if not name:
        raise ToolConfigError("give the server a name")
    if name in taken:
        raise ToolConfigError(f"a server is already named '{name}'; choose another name or "
                              "remove that one first")
    if form.transport == "command":
        command, *args = split_command_line(form.command_line)
        return McpServerConfig(name, command=command, args=tuple(args),
                               env=env_from_lines(form.env_lines))
    url = form.url.strip()
    if not url:
        raise ToolConfigError("give the server's URL, such as https://example.com/mcp")
    return McpServerConfig(name, url=url, headers=headers_from_lines(form.header_lines))


def split_command_line(text: str) -> list[str]:
    """The program and its arguments, split as a POSIX shell would (quotes group words)."""
    try:
        words = shlex.split(text)
    except ValueError as exc:
        raise ToolConfigError(f"the command line cannot be split into words: {exc}; close "
                              "the quote or escape it") from None
    if not words:
        raise ToolConfigError("give the command that starts the server, such as "
                              "'npx -y @modelcontextprotocol/server-memory'")
    return words


def env_from_lines(text: str) -> dict[str, str]:
    """Environment variables from KEY=VALUE lines; the value is kept as typed, blank lines
    are skipped."""
    return _pairs_from_lines(text, "=", "environment variable", "KEY=VALUE")


def headers_from_lines(text: str) -> dict[str, str]:
    """HTTP headers from "Name: value" lines, such as "Authorization: Bearer …"."""
    pairs = _pairs_from_lines(text, ":", "header", "Name: value")
    return {key: value.strip() for key, value in pairs.items()}


def _pairs_from_lines(text: str, separator: str, kind: str, shape: str) -> dict[str, str]:
    pairs: dict[str, str] = {}
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        key, found, value = line.partition(separator)
        key = key.strip()
        if not found or not key:
            raise ToolConfigError(f"{kind} line {number} ('{line.strip()[:60]}') must read "
                                  f"{shape}")
        if key in pairs:
            raise ToolConfigError(f"the {kind} '{key}' is given twice; keep one")
        pairs[key] = value
    return pairs


# Import and export ------------------------------------------------------------------------------

def read_config_file(path: Path) -> str:
    """The text of an {"mcpServers": ...} file to import: UTF-8 (a byte-order mark is allowed),
    at most MAX_TEXT_BYTES; ToolConfigError in words otherwise."""
    try:
        return read_utf8(path, MAX_TEXT_BYTES)
    except OSError as exc:
        raise ToolConfigError(f"'{path}' cannot be read: {exc.strerror or exc}") from None
    except FileTooLargeError:
        raise ToolConfigError(f"'{path.name}' is larger than {MAX_TEXT_BYTES // 1024} KiB; "
                              "this is not a servers configuration") from None
    except UnicodeDecodeError:
        raise ToolConfigError(f"'{path.name}' is not UTF-8 text") from None


def write_config_file(path: Path, servers: Iterable[McpServerConfig]) -> None:
    """Write the servers as the {"mcpServers": ...} JSON other apps read."""
    try:
        path.write_text(mcp_servers_json(servers), encoding="utf-8")
    except OSError as exc:
        raise ToolConfigError(f"'{path}' cannot be written: {exc.strerror or exc}") from None


def import_words(imported: Iterable[McpServerConfig], existing: Collection[str]) -> str:
    """What importing `imported` over the servers named `existing` does, in words."""
    names = [config.name for config in imported]
    added = [name for name in names if name not in existing]
    replaced = [name for name in names if name in existing]
    parts = []
    if added:
        parts.append(f"Added {_count(len(added))}: {', '.join(added)}.")
    if replaced:
        parts.append(f"Replaced {_count(len(replaced))} of the same name: "
                     f"{', '.join(replaced)}.")
    return " ".join(parts)


def _count(servers: int) -> str:
    return "1 server" if servers == 1 else f"{servers} servers"


# The tools each server listed -------------------------------------------------------------------

ListingState = Literal["listing", "listed", "failed"]


@dataclass(slots=True, frozen=True)
class Listing:
    """A server's tools as last listed (name, description), or why they could not be."""

    state: ListingState
    tools: tuple[tuple[str, str], ...] = ()
    error: str = ""


class ToolListings:
    """The tools the dialog has asked each server for. Each of `listeners` hears the name of
    a server whose listing changed; a listing is forgotten when its server is changed or
    removed (the tools may differ)."""

    def __init__(self, list_tools: Callable[[str], Awaitable[list[McpTool]]]) -> None:
        self._list_tools = list_tools
        self._listings: dict[str, Listing] = {}
        self._listed_for: dict[str, McpServerConfig] = {}
        self.listeners: list[Callable[[str], None]] = []

    def get(self, server: str) -> Listing | None:
        return self._listings.get(server)

    def refresh(self, server: McpServerConfig) -> Coroutine[Any, Any, Listing]:
        """Mark `server` as being listed now, and give the coroutine that lists its tools
        (starting it); a failure is kept in words, not raised."""
        previous = self._listings.get(server.name)
        same = previous is not None and self._listed_for.get(server.name) == server
        self._listed_for[server.name] = server
        self._set(server.name, Listing("listing", previous.tools if same else ()))
        return self._list(server)

    async def _list(self, server: McpServerConfig) -> Listing:
        try:
            tools = await self._list_tools(server.name)
        except ToolError as exc:
            listing = Listing("failed", error=_error_words(exc))
        else:
            listing = Listing("listed", tuple((tool.name, tool.description) for tool in tools))
        if self._listed_for.get(server.name) == server:  # not changed meanwhile
            self._set(server.name, listing)
        return listing

    def keep_only(self, servers: Iterable[McpServerConfig]) -> None:
        """Forget the listings of servers no longer configured as they were listed."""
        current = {config.name: config for config in servers}
        for name, config in list(self._listed_for.items()):
            if current.get(name) != config:
                del self._listed_for[name]
                self._listings.pop(name, None)
                self._announce(name)

    def _set(self, server: str, listing: Listing) -> None:
        self._listings[server] = listing
        self._announce(server)

    def _announce(self, server: str) -> None:
        for listener in list(self.listeners):
            listener(server)


def _error_words(exc: ToolError) -> str:
    return exc.message if isinstance(exc, ToolServerError) else str(exc)
