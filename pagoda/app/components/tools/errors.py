"""What can go wrong with MCP tool servers, in words a user can act on. Each message names the
server (as the user named it in the configuration) and, where there is one, the fix."""

from __future__ import annotations


class ToolError(Exception):
    """Any failure of the tools layer."""


class ToolConfigError(ToolError):
    """The servers' configuration cannot be read: bad JSON, a missing or malformed field, a key
    Pagoda does not honour, or something too large."""


class ToolServerError(ToolError):
    """A server cannot be used: it is not configured or is disabled, its command was not found,
    it exited, it did not answer in time at start, or its connection failed."""

    def __init__(self, server: str, message: str) -> None:
        super().__init__(f"{server}: {message}")
        self.server = server
        self.message = message


class ToolTimeoutError(ToolError):
    """A tool call ran past its time limit; the call was cancelled at the server."""

    def __init__(self, server: str, tool: str, timeout_s: float) -> None:
        super().__init__(f"{server}: the tool '{tool}' did not finish within {timeout_s:g} s; "
                         "the call was cancelled")
        self.server = server
        self.tool = tool
        self.timeout_s = timeout_s


class UnknownToolError(ToolError):
    """A function name the catalog does not hold (a model can make one up)."""

    def __init__(self, name: str, known: list[str]) -> None:
        shown = ", ".join(known[:20]) + (", …" if len(known) > 20 else "")
        super().__init__(f"there is no tool named '{name}'; the tools are: {shown or 'none'}")
        self.name = name
