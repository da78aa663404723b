"""Writing a streamed reply to the store often enough to survive a crash, rarely enough to be cheap."""

import time
from collections.abc import Callable
from typing import Protocol

from .errors import StoreError
from .records import GenerationStats, ReplyParts, ToolCall

FLUSH_INTERVAL_S = 0.5


class StreamingSink(Protocol):
    def update_streaming(self, mid: int, content: str, reasoning: str | None = None) -> None: ...
    def finish_message(
        self,
        mid: int,
        content: str,
        finish_reason: str,
        stats: GenerationStats | None = None,
        *,
        prompt_tokens: int | None = None,
        completion_tokens: int | None = None,
        parts: ReplyParts | None = None,
    ) -> None: ...
    def interrupt_message(
        self,
        mid: int,
        content: str,
        finish_reason: str | None = None,
        stats: GenerationStats | None = None,
        *,
        prompt_tokens: int | None = None,
        completion_tokens: int | None = None,
        parts: ReplyParts | None = None,
    ) -> None: ...
    def fail_message(self, mid: int, content: str, error: str,
                     parts: ReplyParts | None = None) -> None: ...


class StreamingWriter:
    """Accumulates deltas for one assistant message and flushes at most every `interval` seconds.

    The first delta is written at once, so a reply is on disk from its first token; the end
    of the stream (finish, interrupt, fail) always writes the full text. The model's reasoning
    (`append_reasoning`) is kept the same way, apart from the answer, with how long it took
    (from its first piece to the answer's first, or to the end), and so are the calls the reply
    made (`set_tool_calls`), written at its end.
    """

    def __init__(
        self,
        store: StreamingSink,
        message_id: int,
        *,
        interval: float = FLUSH_INTERVAL_S,
        clock: Callable[[], float] = time.monotonic,
        text: str = "",
    ) -> None:
        """`text`: what the message already holds (a reply being continued)."""
        self._store = store
        self.message_id = message_id
        self._interval = interval
        self._clock = clock
        self._text = text
        self._flushed_text = text
        self._reasoning: str | None = None
        self._flushed_reasoning: str | None = None
        self._reasoning_started: float | None = None
        self._reasoning_s: float | None = None
        self._tool_calls: tuple[ToolCall, ...] = ()
        self._last_flush: float | None = None
        self.flush_count = 0
        self.closed = False

    @property
    def text(self) -> str:
        return self._text

    @property
    def flushed_text(self) -> str:
        """What the database holds for this message right now."""
        return self._flushed_text

    @property
    def reasoning(self) -> str | None:
        return self._reasoning

    @property
    def parts(self) -> ReplyParts:
        """The reasoning, its duration (so far, while it goes on) and the calls."""
        return ReplyParts(self._reasoning, self._reasoning_duration(), self._tool_calls)

    def append(self, delta: str) -> None:
        self._check_open()
        if delta:
            self._end_reasoning()
        self._text += delta
        self.flush_if_due()

    def append_reasoning(self, delta: str) -> None:
        self._check_open()
        if self._reasoning is None:
            self._reasoning, self._reasoning_started = "", self._clock()
        self._reasoning += delta
        self.flush_if_due()

    def set_tool_calls(self, calls: tuple[ToolCall, ...]) -> None:
        self._check_open()
        self._tool_calls = calls

    def _end_reasoning(self) -> None:
        if self._reasoning_started is not None and self._reasoning_s is None:
            self._reasoning_s = self._clock() - self._reasoning_started

    def _reasoning_duration(self) -> float | None:
        if self._reasoning_started is None or self._reasoning_s is not None:
            return self._reasoning_s
        return self._clock() - self._reasoning_started

    def flush_if_due(self) -> None:
        """Also worth calling on a timer, so a stalled stream still reaches the disk."""
        now = self._clock()
        due = self._last_flush is None or now - self._last_flush >= self._interval
        changed = (self._text != self._flushed_text
                   or self._reasoning != self._flushed_reasoning)
        if due and changed:
            self._store.update_streaming(self.message_id, self._text, self._reasoning)
            self._mark_flushed(now)

    def finish(
        self,
        finish_reason: str,
        stats: GenerationStats | None = None,
        *,
        prompt_tokens: int | None = None,
        completion_tokens: int | None = None,
    ) -> None:
        self._end(self._store.finish_message, finish_reason, stats, prompt_tokens,
                  completion_tokens)

    def interrupt(
        self,
        finish_reason: str | None = None,
        stats: GenerationStats | None = None,
        *,
        prompt_tokens: int | None = None,
        completion_tokens: int | None = None,
    ) -> None:
        """End as interrupted; `finish_reason` "stopped" when the user stopped it."""
        self._end(self._store.interrupt_message, finish_reason, stats, prompt_tokens,
                  completion_tokens)

    def _end(self, end_message, finish_reason, stats, prompt_tokens, completion_tokens) -> None:
        self._check_open()
        self._end_reasoning()
        end_message(self.message_id, self._text, finish_reason, stats,
                    prompt_tokens=prompt_tokens, completion_tokens=completion_tokens,
                    parts=self._parts_to_store())
        self._close()

    def fail(self, error: str) -> None:
        self._check_open()
        self._end_reasoning()
        self._store.fail_message(self.message_id, self._text, error, self._parts_to_store())
        self._close()

    def _parts_to_store(self) -> ReplyParts | None:
        """None where the reply has neither reasoning nor calls: the columns stay as they are
        (a continued reply keeps what its first part held)."""
        parts = self.parts
        return None if parts == ReplyParts() else parts

    def _mark_flushed(self, now: float) -> None:
        self._flushed_text = self._text
        self._flushed_reasoning = self._reasoning
        self._last_flush = now
        self.flush_count += 1

    def _close(self) -> None:
        self._mark_flushed(self._clock())
        self.closed = True

    def _check_open(self) -> None:
        if self.closed:
            raise StoreError(f"the stream of message {self.message_id} has already ended")
