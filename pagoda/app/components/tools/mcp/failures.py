"""What the SDK and its transports raise, said in words a user can act on ("the command 'foo' was
not found", "the server exited; its last log line: ..."): the message of a ToolServerError."""

from __future__ import annotations

import httpx2
import mcp.types as mcp_types

from pagoda.app.backends.errors import clause
from pagoda.app.components.tools.config import McpServerConfig
from pagoda.app.components.tools.errors import ToolServerError


def first_cause(exc: BaseException) -> BaseException:
    """The first exception an ExceptionGroup (the SDK's task groups raise them) holds, however
    deeply nested; `exc` itself when it is not a group."""
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    return exc


def is_connection_closed(exc: BaseException) -> bool:
    """The server's side went away: it exited, or closed its connection."""
    code = getattr(first_cause(exc), "code", None)
    return code == mcp_types.CONNECTION_CLOSED


def describe_failure(config: McpServerConfig, exc: BaseException, last_log_line: str,
                     *, starting: bool) -> str:
    """Why `config`'s server could not be used, for ToolServerError.message."""
    cause = first_cause(exc)
    if isinstance(cause, ToolServerError):
        return cause.message
    if is_connection_closed(cause):
        return _closed(config, last_log_line, starting=starting)
    if isinstance(cause, OSError) and config.transport == "stdio":
        return _not_started(config.command, cause)
    if isinstance(cause, httpx2.HTTPStatusError):
        return _http_status(config.url, cause.response.status_code)
    if isinstance(cause, httpx2.TransportError):
        return f"cannot connect to {config.url}: {clause(cause) or type(cause).__name__}"
    said = clause(getattr(cause, "message", None) or cause) or type(cause).__name__
    if starting and config.transport != "stdio":
        return f"{config.url} refused the session: {said}"
    return f"the server failed {'to start' if starting else 'the request'}: {said}"


def _closed(config: McpServerConfig, last_log_line: str, *, starting: bool) -> str:
    if config.transport != "stdio":
        return "the server closed the connection"
    when = " before it answered" if starting else ""
    if last_log_line:
        return f"the server exited{when}; its last log line: {last_log_line}"
    return f"the server exited{when}, writing nothing on stderr"


def _not_started(command: str, error: OSError) -> str:
    if isinstance(error, FileNotFoundError):
        return f"the command '{command}' was not found; install it or give its full path"
    if isinstance(error, PermissionError):
        return f"the command '{command}' cannot be run (permission denied)"
    return f"the command '{command}' could not be started: {error.strerror or error}"


def _http_status(url: str, status: int) -> str:
    if status in (401, 403):
        return (f"{url} refused the credentials (HTTP {status}); check the server's "
                "'headers'")
    if status == 404:
        return f"there is no MCP server at {url} (HTTP 404)"
    return f"{url} answered HTTP {status}"
