"""What a chat needs to let its model call tools, and what the tools feature gives it: where the
tools come from (`ChatTools`), the functions offered (`ToolOffer`) and how a call ended
(`ToolOutcome`). The seam between pagoda.app.components.chat and pagoda.app.components.tools, which
import each other through it only. No Qt."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal, Protocol

from pagoda.app.backends import ToolSpec


@dataclass(slots=True, frozen=True)
class ToolOutcome:
    """How a call ended ("done" or "failed") and what the model is told: the tool's result, or
    the failure in words (a server that would not start, crashed or timed out)."""

    outcome: Literal["done", "failed"]
    text: str


@dataclass(slots=True, frozen=True)
class ToolOffer:
    """The functions a chat's model is shown, and what kept others out, in words (a server
    that would not start)."""

    specs: tuple[ToolSpec, ...] = ()
    problems: tuple[str, ...] = ()


class ChatTools(Protocol):
    """The tools chats may give their model (Settings -> Tools). Called on the app's loop."""

    @property
    def max_calls_per_turn(self) -> int:
        """How many calls one turn may make before its model must answer without tools."""

    async def offer(self, selectors: Sequence[str]) -> ToolOffer:
        """The functions a chat with these selectors ("server", "server/tool") may call, as the
        model is shown them. Starts servers that are not running; a server that cannot start
        is left out, and said why."""

    def server_of(self, name: str) -> str | None:
        """The server of the function `name`, as `offer` named it; None: unknown."""

    def always_allowed(self, name: str) -> bool:
        """Whether calls of `name` run without asking (the user's "Always for this tool")."""

    def allow_always(self, name: str) -> None: ...

    async def call(self, name: str, arguments: str) -> ToolOutcome:
        """Run the call; every failure comes back as a "failed" outcome in words, never raised
        (cancelling the task stops the call)."""
