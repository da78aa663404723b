"""A chat's turn: write the reply; while it ends calling tools, ask the user about each call
(unless its tool always runs), run it, store its result, and write the next reply from the
results. The calls' states are views the session redraws. No Qt."""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import replace

from pagoda.app.backends import ToolSpec
from pagoda.app.components.chat.reply_stream import ReplyStream
from pagoda.app.components.chat.session_seam import TurnHost
from pagoda.app.components.chat.tool_turns import (
    DECISIONS,
    DENIED,
    STOPPED,
    CallKey,
    Decision,
    call_outcomes,
    call_views,
    over_the_limit,
)
from pagoda.app.components.shared.tool_seam import ToolOutcome
from pagoda.app.components.shared.view_models import MessageView, ToolCallState
from pagoda.app.store import Message, ToolCall


class ChatTurn:
    """The turns of one session, one at a time: its reply stream, the calls waiting for the
    user's Run or Deny, the one running, and the tools the last reply offered."""

    def __init__(self, session: TurnHost) -> None:
        self.session = session
        self.stream = ReplyStream(session, self.tool_specs)
        self._call_states: dict[CallKey, ToolCallState] = {}
        self._decisions: dict[CallKey, asyncio.Future[Decision]] = {}
        self._running_call: asyncio.Task[ToolOutcome] | None = None
        self._offered: tuple[tuple[str, ...], tuple[ToolSpec, ...]] = ((), ())
        self.replying_now = False  # from the user's action until its reply has ended
        self._streamed = False  # the view was told a reply streams (told again when it ends)

    @contextlib.asynccontextmanager
    async def replying(self):
        """Mark the chat busy for one action, before its first await: a second action (or a
        click on Regenerate) while the first stores its message is refused, not interleaved."""
        s = self.session
        self.replying_now, s.stop_requested = True, False
        try:
            yield
        finally:
            self.replying_now = False
            self.forget_calls()
            if self._streamed and not s.closed:
                self._streamed = False
                s.set_streaming(False)
                await s.refresh_context_meter()
                s.on_conversation_changed(s.conversation_id)

    async def generate(self, parent_id: int) -> None:
        """A new reply under `parent_id`, and the turn it begins."""
        if not self.session.closed:
            await self.run(await self.start_reply(parent_id))

    async def start_reply(self, parent_id: int) -> Message:
        s = self.session
        backend = s.source.backend
        return await s.db.start_assistant_message(
            s.conversation_id, parent_id=parent_id,
            model=backend.model_name if backend is not None else "")

    def begin_streaming(self) -> None:
        self._streamed = True
        self.session.set_streaming(True)

    async def run(self, message: Message, continuing: bool = False) -> None:
        """Write the reply; while it ends calling tools, answer the calls (asking the user) and
        write the next reply from their results. After the turn's most calls the model answers
        without tools."""
        s = self.session
        calls_left = s.tools.max_calls_per_turn if s.tools is not None else 0
        while True:
            await self.stream.write(message, continuing, with_tools=calls_left > 0)
            calls = self._calls_to_answer(message.id)
            if not calls:
                return
            parent = await self._answer_calls(message.id, calls, calls_left)
            calls_left = max(0, calls_left - len(calls))
            if parent is None or s.closed or s.stop_requested:
                return
            message, continuing = await self.start_reply(parent), False

    def answer(self, message_id: int, index: int, decision: str) -> None:
        """The user's answer to the call `index` of the reply `message_id`, waiting for it:
        "run", "always" (run, and never ask for this tool again) or "deny". An answer to no
        waiting call is ignored: it came late."""
        if decision not in DECISIONS:
            raise ValueError(f"a call's answer is one of {', '.join(DECISIONS)}, not {decision!r}")
        future = self._decisions.get((message_id, index))
        if future is not None and not future.done():
            future.set_result(decision)  # type: ignore[arg-type]

    def end_tool_work(self) -> None:
        """A call waiting for the user's answer is not run, a running one is cancelled."""
        for future in self._decisions.values():
            if not future.done():
                future.set_result("stop")
        if self._running_call is not None:
            self._running_call.cancel()

    def forget_calls(self) -> None:
        """The turn ended: its calls are drawn as stored."""
        if self._call_states:
            self._call_states.clear()
            self.redraw_calls()

    def with_calls(self, path: list[Message], views: list[MessageView]) -> list[MessageView]:
        """The views with each reply's calls and where they stand."""
        outcomes = call_outcomes(path)
        return [replace(v, tool_calls=call_views(m, outcomes, self._call_states,
                                                 self.session.tools))
                if m.tool_calls else v for m, v in zip(path, views, strict=True)]

    def _calls_to_answer(self, message_id: int) -> tuple[ToolCall, ...]:
        s = self.session
        last = s.path[-1] if s.path else None
        if (s.tools is None or s.closed or s.stop_requested or last is None
                or last.id != message_id or last.finish_reason != "tool_calls"):
            return ()
        return last.tool_calls

    async def _answer_calls(self, message_id: int, calls: tuple[ToolCall, ...],
                            calls_left: int) -> int | None:
        """Run (or deny) each call in turn, its result stored under the previous one; the last
        result's id, or None where the user stopped the turn before a call was answered."""
        s = self.session
        parent = message_id
        for i, call in enumerate(calls):
            if i >= calls_left:
                ended = "denied", over_the_limit(s.tools.max_calls_per_turn)
            else:
                ended = await self._decide_and_run((message_id, i), call)
            if ended is None or s.closed:
                return None
            result = await s.db.append_tool_message(parent, call, ended[1], ended[0])
            parent = result.id
            self._call_states.pop((message_id, i), None)
            await s.reload()
            if s.stop_requested:
                return None
        return parent

    async def _decide_and_run(self, key: CallKey, call: ToolCall) -> tuple[str, str] | None:
        """(outcome, what the model is told), or None: stopped while the user was asked."""
        tools = self.session.tools
        if not tools.always_allowed(call.name):
            decision = await self._ask(key)
            if decision == "stop":
                return None
            if decision == "deny":
                return "denied", DENIED
            if decision == "always":
                tools.allow_always(call.name)
        self._show_call_state(key, "running")
        task = asyncio.ensure_future(tools.call(call.name, call.arguments))
        self._running_call = task
        try:
            await asyncio.wait({task})
        except asyncio.CancelledError:
            task.cancel()
            raise
        finally:
            self._running_call = None
        if task.cancelled():
            return "failed", STOPPED
        outcome = task.result()
        return outcome.outcome, outcome.text

    async def _ask(self, key: CallKey) -> Decision:
        future: asyncio.Future[Decision] = asyncio.get_running_loop().create_future()
        self._decisions[key] = future
        self._show_call_state(key, "asking")
        try:
            return await future
        finally:
            self._decisions.pop(key, None)

    def _show_call_state(self, key: CallKey, state: ToolCallState) -> None:
        self._call_states[key] = state
        self.redraw_calls(key[0])

    def redraw_calls(self, message_id: int | None = None) -> None:
        """Show where the calls of `message_id` (None: of every reply shown) stand now."""
        s = self.session
        if s.closed:
            return
        outcomes = call_outcomes(s.path)
        messages = {m.id: m for m in s.path if m.tool_calls}
        for i, v in enumerate(s.views):
            m = messages.get(v.id)
            if m is None or message_id not in (None, v.id):
                continue
            view = replace(v, tool_calls=call_views(m, outcomes, self._call_states, s.tools))
            if view != v:
                s.views[i] = view
                s.view.update_message(view)

    async def tool_specs(self, message_id: int) -> tuple[ToolSpec, ...]:
        """The tools this chat turned on, as the model is shown them (servers start here)."""
        s = self.session
        selectors = s.conversation.sampling.tools
        if s.tools is None or not selectors:
            return ()
        s.view.show_reading(message_id, "starting this chat's tools…")
        offer = await s.tools.offer(selectors)
        s.view.show_reading(message_id, None)
        if offer.problems:
            s.notify("Some of this chat's tools are left out of this reply: "
                     + "; ".join(offer.problems), error=True)
        self._offered = (selectors, offer.specs)
        return offer.specs

    def tools_in_prompt(self) -> tuple[ToolSpec, ...]:
        """The tools the last reply offered, while the chat still has them on (the meter counts
        them without starting any server)."""
        selectors, specs = self._offered
        return specs if self.session.conversation.sampling.tools == selectors else ()
