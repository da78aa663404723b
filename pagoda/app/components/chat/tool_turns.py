"""What a chat needs to let its model call tools: where the tools come from (`ChatTools`), how
a call ended (`ToolOutcome`), and how a branch's calls and results read as views and as the
messages the model is given. No Qt; the MCP side is pagoda.app.components.tools."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal, Protocol

from pagoda.app.backends import ToolCallRecord, ToolSpec
from pagoda.app.components.shared.view_models import ToolCallState, ToolCallView
from pagoda.app.store import Message, ToolCall

Decision = Literal["run", "always", "deny", "stop"]
DECISIONS: tuple[str, ...] = ("run", "always", "deny")
DENIED = "The user denied this call: it did not run."
STOPPED = "The user stopped the reply before this call returned."


def over_the_limit(max_calls: int) -> str:
    return (f"Not run: this turn has made the most tool calls a turn may ({max_calls}). "
            "Answer with what you have.")


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


# A call, as the turn keys it: the id of the reply that made it and its place among the reply's
# calls. Never the model's own id, which models reuse from turn to turn ("call_1" again).
CallKey = tuple[int, int]


def call_views(message: Message, results: dict[CallKey, str],
               states: dict[CallKey, ToolCallState],
               tools: ChatTools | None) -> tuple[ToolCallView, ...]:
    """The calls of `message` as shown: a stored result's outcome, else where the running turn
    has them (`states`), else never run."""
    return tuple(
        ToolCallView(call.id, call.name, call.arguments,
                     results.get((message.id, i)) or states.get((message.id, i), "not run"),
                     tools.server_of(call.name) if tools is not None else None)
        for i, call in enumerate(message.tool_calls))


def call_outcomes(path: Sequence[Message]) -> dict[CallKey, str]:
    """The outcome of every call answered on the branch. A result answers a call of the reply
    just above it (results follow their reply, each under the one before), the first of that
    reply's calls with its id not answered yet."""
    outcomes: dict[CallKey, str] = {}
    caller: Message | None = None
    for m in path:
        if m.role != "tool":
            caller = m if m.role == "assistant" else None
            continue
        if caller is None or m.tool_call_id is None:
            continue
        index = next((i for i, c in enumerate(caller.tool_calls)
                      if c.id == m.tool_call_id and (caller.id, i) not in outcomes), None)
        if index is not None:
            outcomes[(caller.id, index)] = m.finish_reason or "done"
    return outcomes


def answered_calls(message: Message,
                   answered: dict[CallKey, str]) -> tuple[ToolCallRecord, ...]:
    """The calls of `message` answered on the branch (`call_outcomes`), as the model is given
    them (a call without its result, from a turn that was stopped, is left out: templates and
    servers want each call answered)."""
    return tuple(ToolCallRecord(c.id, c.name, c.arguments)
                 for i, c in enumerate(message.tool_calls) if (message.id, i) in answered)


def stored_calls(records: Sequence[ToolCallRecord]) -> tuple[ToolCall, ...]:
    return tuple(ToolCall(r.id, r.name, r.arguments) for r in records)


def turn_start(path: Sequence[Message], message_id: int) -> int | None:
    """The user's message a reply answers: above it on the branch, past the calls and results
    of its turn (None: a reply with no user message above it)."""
    ids = [m.id for m in path]
    if message_id not in ids:
        return None
    for m in reversed(path[:ids.index(message_id)]):
        if m.role == "user":
            return m.id
    return None
