"""The plain data the hub hands out: a server's status and a tool call's result. No SDK here, so
the window can import them at no cost."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

State = Literal["stopped", "starting", "running", "failed"]


@dataclass(frozen=True, slots=True)
class ServerStatus:
    """`state`, and a message: why it failed, or why it is stopped ("disabled", "not
    configured"); "" when there is nothing to say."""

    state: State
    message: str = ""


@dataclass(frozen=True, slots=True)
class ToolResult:
    """What a call gave back, as the text the model reads next: `is_error` when the tool
    reported a failure (the model can read `text` and try again)."""

    text: str
    is_error: bool = False
