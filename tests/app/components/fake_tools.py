"""Tools for ChatSession's tests whose results the test decides, and a call that never returns.
The MCP-backed tools are tested with a real MCP server (test_mcp_chat_tools.py)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Sequence

from pagoda.app.backends import ToolCallRecord, ToolSpec
from pagoda.app.components.shared.tool_seam import ToolOffer, ToolOutcome

ADD = ToolSpec("add", "Adds two integers.", {"type": "object", "properties": {
    "a": {"type": "integer"}, "b": {"type": "integer"}}})
HANG = ToolSpec("hang", "Never returns.")
BROKEN = ToolSpec("broken", "Its server has crashed.")


def call(name: str, arguments: str = "{}", call_id: str | None = None) -> ToolCallRecord:
    return ToolCallRecord(call_id or f"call_{name}", name, arguments)


class FakeTools:
    """ChatTools over three functions: `add` sums, `hang` waits until cancelled, `broken`
    fails as a crashed server does. Every server is called "fake"."""

    def __init__(self, max_calls_per_turn: int = 4) -> None:
        self.max_calls_per_turn = max_calls_per_turn
        self.calls: list[tuple[str, str]] = []
        self.cancelled: list[str] = []
        self.asked_specs: list[tuple[str, ...]] = []
        self._always: set[str] = set()

    async def offer(self, selectors: Sequence[str]) -> ToolOffer:
        self.asked_specs.append(tuple(selectors))
        return ToolOffer((ADD, HANG, BROKEN) if "fake" in selectors else ())

    def server_of(self, name: str) -> str | None:
        return "fake" if name in ("add", "hang", "broken") else None

    def always_allowed(self, name: str) -> bool:
        return name in self._always

    def allow_always(self, name: str) -> None:
        self._always.add(name)

    async def call(self, name: str, arguments: str) -> ToolOutcome:
        self.calls.append((name, arguments))
        if name == "hang":
            try:
                await asyncio.sleep(3600)
            except asyncio.CancelledError:
                self.cancelled.append(name)
                raise
        if name == "broken":
            return ToolOutcome("failed", "fake: the server exited (code 1)")
        args = json.loads(arguments)
        return ToolOutcome("done", str(args["a"] + args["b"]))


def answer(session, call_id: str, decision: str) -> None:
    """Answer the call with the model's id `call_id` that waits for the user, as its card's
    Run / Always / Deny does: by the reply that made it and its place among the reply's calls."""
    asking = [(v.id, i) for v in session.views for i, c in enumerate(v.tool_calls)
              if c.id == call_id and c.state == "asking"]
    assert len(asking) == 1, f"{len(asking)} calls {call_id} wait for the user"
    session.answer_tool_call(*asking[0], decision)
