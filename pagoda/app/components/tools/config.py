"""The MCP servers a user gives the model, in the JSON that Claude Desktop, Cursor and LM Studio
write:

    {"mcpServers": {
        "weather": {"command": "uvx", "args": ["weather-mcp"], "env": {"API_KEY": "..."}},
        "search":  {"url": "https://example.com/mcp", "headers": {"Authorization": "Bearer ..."}}}}

Per server Pagoda reads `command`, `args`, `env`, `cwd` (a server it starts and talks to over
stdin/stdout), or `url` and `headers` (a server reached over streamable HTTP), and `type`
("stdio"; "http" or "streamable-http"; "sse" for the older HTTP+SSE transport; a `url` without a
`type` is streamable HTTP), `disabled` (Cline's and Windsurf's switch) and `description` (kept
and written back). Any other key is refused in words rather than dropped, among them `timeout`
(seconds in Cline, milliseconds in Gemini CLI: Pagoda sets the time limit of a call itself),
`autoApprove`/`alwaysAllow` (approval lists Pagoda does not read) and `envFile`. Text that is
empty or only whitespace means no servers.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, Literal
from urllib.parse import urlsplit

from pagoda.app.components.tools.errors import ToolConfigError

Transport = Literal["stdio", "http", "sse"]

MAX_TEXT_BYTES = 1024 * 1024
MAX_SERVERS = 64
MAX_NAME_CHARS = 64
MAX_ARGS = 256
MAX_STRING_BYTES = 8 * 1024
MAX_MAP_ENTRIES = 256  # variables of `env`, fields of `headers`

_NAME = re.compile(r"[A-Za-z0-9_. -]+")
_HEADER_NAME = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+")
_TYPES: dict[str, Transport] = {"stdio": "stdio", "http": "http", "streamable-http": "http",
                               "sse": "sse"}
_READ_KEYS = ("command", "args", "env", "cwd", "url", "headers", "type", "disabled",
              "description")
_WHY_REFUSED = {
    "timeout": "other apps read it in seconds or in milliseconds; Pagoda sets the time limit "
               "of a tool call itself",
    "autoApprove": "Pagoda does not read approval lists",
    "alwaysAllow": "Pagoda does not read approval lists",
    "envFile": "put the variables in 'env' instead",
    "serverUrl": "write it as 'url'",
    "transportType": "write it as 'type'",
}



@dataclass(frozen=True, slots=True)
class McpServerConfig:
    """One server: started from `command` (stdio), or reached at `url` (streamable HTTP, or the
    older HTTP+SSE transport when `sse`). Checked when made: a bad field raises ToolConfigError
    naming the server and the field."""

    name: str
    command: str = ""
    args: tuple[str, ...] = ()
    env: dict[str, str] = field(default_factory=dict, hash=False)
    cwd: str | None = None
    url: str = ""
    headers: dict[str, str] = field(default_factory=dict, hash=False)
    sse: bool = False
    enabled: bool = True
    description: str = ""

    def __post_init__(self) -> None:
        _check_name(self.name)
        if self.command:
            _check_stdio(self)
        elif self.url:
            _check_http(self)
        else:
            raise _error(self.name, "give either 'command' (a program to start) or 'url'")
        _check_string(self.name, "description", self.description)

    @property
    def transport(self) -> Transport:
        if self.command:
            return "stdio"
        return "sse" if self.sse else "http"


def parse_mcp_servers(text: str) -> list[McpServerConfig]:
    """The servers of an `{"mcpServers": {...}}` document, in its order. Raises ToolConfigError
    naming the server and the field for anything Pagoda cannot honour."""
    if len(text) > MAX_TEXT_BYTES or len(text.encode("utf-8")) > MAX_TEXT_BYTES:
        raise ToolConfigError(f"the configuration is larger than {MAX_TEXT_BYTES // 1024} KiB")
    if not text.strip():
        return []
    servers = _servers_object(_load_json(text))
    if len(servers) > MAX_SERVERS:
        raise ToolConfigError(f"{len(servers)} servers are configured; at most {MAX_SERVERS} "
                              "can be")
    return [_server_from_json(name, entry) for name, entry in servers.items()]


def mcp_servers_json(configs: Iterable[McpServerConfig]) -> str:
    """The `{"mcpServers": {...}}` document that parse_mcp_servers reads back as `configs`."""
    servers: dict[str, dict[str, Any]] = {}
    for config in configs:
        if config.name in servers:
            raise ToolConfigError(f"two servers are named '{config.name}'; rename one")
        servers[config.name] = _server_to_json(config)
    return json.dumps({"mcpServers": servers}, indent=2, ensure_ascii=False) + "\n"


def _load_json(text: str) -> Any:
    try:
        return json.loads(text, object_pairs_hook=_refuse_duplicate_keys)
    except json.JSONDecodeError as exc:
        raise ToolConfigError(f"the configuration is not valid JSON: {exc.msg} at line "
                              f"{exc.lineno}, column {exc.colno}") from None
    except RecursionError:
        raise ToolConfigError("the configuration nests too deeply") from None


def _refuse_duplicate_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    result: dict[str, Any] = {}
    for key, value in pairs:
        if key in result:
            raise ToolConfigError(f"the key '{key}' is written twice in one object; keep one")
        result[key] = value
    return result


def _servers_object(document: Any) -> dict[str, Any]:
    if not isinstance(document, dict):
        raise ToolConfigError('the configuration must be a JSON object: {"mcpServers": {...}}')
    for key in document:
        if key != "mcpServers":
            hint = " (VS Code's 'servers' is called 'mcpServers' here)" if key == "servers" else ""
            raise ToolConfigError(f"Pagoda reads only 'mcpServers' here; remove '{key}'{hint}")
    servers = document.get("mcpServers", {})
    if not isinstance(servers, dict):
        raise ToolConfigError("'mcpServers' must be an object of servers by name")
    return servers


def _server_from_json(name: str, entry: Any) -> McpServerConfig:
    _check_name(name)
    if not isinstance(entry, dict):
        raise _error(name, "must be an object such as {\"command\": ..., \"args\": [...]}")
    _refuse_unread_keys(name, entry)
    kind = _transport_of(name, entry)
    disabled = _typed(name, entry, "disabled", bool, False)
    common = {"enabled": not disabled,
              "description": _typed(name, entry, "description", str, "")}
    if kind == "stdio":
        _refuse_keys(name, entry, ("url", "headers"), "a server started from 'command'")
        cwd = _typed(name, entry, "cwd", (str, type(None)), None)
        return McpServerConfig(name, command=_typed(name, entry, "command", str, ""),
                               args=tuple(_string_list(name, entry, "args")),
                               env=_string_map(name, entry, "env"), cwd=cwd, **common)
    _refuse_keys(name, entry, ("command", "args", "env", "cwd"), "a server reached at 'url'")
    return McpServerConfig(name, url=_typed(name, entry, "url", str, ""),
                           headers=_string_map(name, entry, "headers"), sse=kind == "sse",
                           **common)


def _refuse_unread_keys(name: str, entry: dict[str, Any]) -> None:
    for key in entry:
        if key not in _READ_KEYS:
            why = _WHY_REFUSED.get(key, "Pagoda reads " + ", ".join(_READ_KEYS))
            raise _error(name, f"Pagoda does not read '{key}' ({why}); remove it")


def _refuse_keys(name: str, entry: dict[str, Any], keys: tuple[str, ...], kind: str) -> None:
    for key in keys:
        if key in entry:
            raise _error(name, f"'{key}' does not apply to {kind}; remove it")


def _transport_of(name: str, entry: dict[str, Any]) -> Transport:
    written = _typed(name, entry, "type", str, None)
    if written is None:
        return "http" if "url" in entry and "command" not in entry else "stdio"
    if written not in _TYPES:
        raise _error(name, f"'type' is '{written}'; it must be one of: " + ", ".join(_TYPES))
    return _TYPES[written]


def _typed(name: str, entry: dict[str, Any], key: str, kind: type | tuple[type, ...],
           default: Any) -> Any:
    value = entry.get(key, default)
    if value is not default and not isinstance(value, kind):
        expected = {str: "a string", bool: "true or false"}.get(kind, "a string or null")
        raise _error(name, f"'{key}' must be {expected}")
    return value


def _string_list(name: str, entry: dict[str, Any], key: str) -> list[str]:
    value = entry.get(key, [])
    if not isinstance(value, list) or not all(isinstance(item, str) for item in value):
        raise _error(name, f"'{key}' must be a list of strings")
    return value


def _string_map(name: str, entry: dict[str, Any], key: str) -> dict[str, str]:
    value = entry.get(key, {})
    if not isinstance(value, dict) or not all(isinstance(item, str) for item in value.values()):
        raise _error(name, f"'{key}' must be an object whose values are strings")
    return value


def _server_to_json(config: McpServerConfig) -> dict[str, Any]:
    entry: dict[str, Any] = {}
    if config.transport == "stdio":
        entry["command"] = config.command
        entry["args"] = list(config.args)
        if config.env:
            entry["env"] = dict(config.env)
        if config.cwd is not None:
            entry["cwd"] = config.cwd
    else:
        entry["type"] = config.transport
        entry["url"] = config.url
        if config.headers:
            entry["headers"] = dict(config.headers)
    if config.description:
        entry["description"] = config.description
    if not config.enabled:
        entry["disabled"] = True
    return entry


def _check_name(name: Any) -> None:
    if not isinstance(name, str) or not _NAME.fullmatch(name) or len(name) > MAX_NAME_CHARS:
        raise ToolConfigError(f"the server name '{str(name)[:80]}' must be 1 to {MAX_NAME_CHARS} "
                              "letters, digits, spaces, '_', '.' or '-'")
    if name != name.strip():
        raise ToolConfigError(f"the server name '{name}' must not start or end with a space")


def _check_stdio(config: McpServerConfig) -> None:
    name = config.name
    if config.url or config.headers or config.sse:
        raise _error(name, "give either 'command' or 'url', not both")
    _check_string(name, "command", config.command)
    if not isinstance(config.args, tuple) or len(config.args) > MAX_ARGS:
        raise _error(name, f"'args' must be a list of at most {MAX_ARGS} strings")
    for arg in config.args:
        _check_string(name, "args", arg)
    _check_map(name, "env", config.env)
    if any(not key or "=" in key for key in config.env):
        raise _error(name, "a name in 'env' is empty or holds '='")
    if config.cwd is not None:
        if not config.cwd:
            raise _error(name, "'cwd' is empty; remove it or name a folder")
        _check_string(name, "cwd", config.cwd)


def _check_http(config: McpServerConfig) -> None:
    name = config.name
    if config.args or config.env or config.cwd is not None:
        raise _error(name, "'args', 'env' and 'cwd' apply only to a server started from "
                           "'command'")
    _check_string(name, "url", config.url)
    parts = urlsplit(config.url)
    if parts.scheme not in ("http", "https") or not parts.hostname or " " in config.url:
        raise _error(name, f"'url' must be an http:// or https:// address, not '{config.url}'")
    _check_map(name, "headers", config.headers)
    for key, value in config.headers.items():
        if not _HEADER_NAME.fullmatch(key) or "\r" in value or "\n" in value:
            raise _error(name, f"the header '{key}' is not a valid HTTP header")


def _check_map(name: str, field_name: str, mapping: Any) -> None:
    if not isinstance(mapping, dict) or len(mapping) > MAX_MAP_ENTRIES:
        raise _error(name, f"'{field_name}' must be an object of at most {MAX_MAP_ENTRIES} "
                           "strings")
    for key, value in mapping.items():
        _check_string(name, field_name, key)
        _check_string(name, field_name, value)


def _check_string(name: str, field_name: str, value: Any) -> None:
    if not isinstance(value, str):
        raise _error(name, f"'{field_name}' must hold strings")
    if len(value) > MAX_STRING_BYTES or len(value.encode("utf-8")) > MAX_STRING_BYTES:
        raise _error(name, f"a string in '{field_name}' is longer than "
                           f"{MAX_STRING_BYTES // 1024} KiB")
    if "\0" in value:
        raise _error(name, f"a string in '{field_name}' holds a NUL character")


def _error(name: str, problem: str) -> ToolConfigError:
    return ToolConfigError(f"MCP server '{name}': {problem}")
