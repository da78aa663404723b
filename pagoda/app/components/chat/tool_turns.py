"""How a branch's tool calls and results read as views and as the messages the model is given,
and what the model is told of a call that did not run. What a chat needs of tools (`ChatTools`)
is pagoda.app.components.shared.tool_seam; the MCP side is pagoda.app.components.tools. No Qt."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

from pagoda.app.backends import ToolCallRecord
from pagoda.app.components.shared.tool_seam import ChatTools
from pagoda.app.components.shared.view_models import ToolCallState, ToolCallView
from pagoda.app.store import Message, ToolCall

Decision = Literal["run", "always", "deny", "stop"]
DECISIONS: tuple[str, ...] = ("run", "always", "deny")
DENIED = "The user denied this call: it did not run."
STOPPED = "The user stopped the reply before this call returned."


def over_the_limit(max_calls: int) -> str:
    return (f"Not run: this turn has made the most tool calls a turn may ({max_calls}). "
            "Answer with what you have.")


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
