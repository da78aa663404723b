"""Writing a streamed reply to the store often enough to survive a crash, rarely enough to be cheap."""

import time
from collections.abc import Callable
from typing import Protocol

from .errors import StoreError
from .records import GenerationStats

FLUSH_INTERVAL_S = 0.5


class StreamingSink(Protocol):
    def update_streaming(self, mid: int, content: str) -> None: ...
    def finish_message(
        self,
        mid: int,
        content: str,
        finish_reason: str,
        stats: GenerationStats | None = None,
        *,
        prompt_tokens: int | None = None,
        completion_tokens: int | None = None,
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
    ) -> None: ...
    def fail_message(self, mid: int, content: str, error: str) -> None: ...


class StreamingWriter:
    """Accumulates deltas for one assistant message and flushes at most every `interval` seconds.

    The first delta is written at once, so a reply is on disk from its first token; the end
    of the stream (finish, interrupt, fail) always writes the full text.
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

    def append(self, delta: str) -> None:
        self._check_open()
        self._text += delta
        self.flush_if_due()

    def flush_if_due(self) -> None:
        """Also worth calling on a timer, so a stalled stream still reaches the disk."""
        now = self._clock()
        due = self._last_flush is None or now - self._last_flush >= self._interval
        if due and self._text != self._flushed_text:
            self._store.update_streaming(self.message_id, self._text)
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
        end_message(self.message_id, self._text, finish_reason, stats,
                    prompt_tokens=prompt_tokens, completion_tokens=completion_tokens)
        self._close()

    def fail(self, error: str) -> None:
        self._check_open()
        self._store.fail_message(self.message_id, self._text, error)
        self._close()

    def _mark_flushed(self, now: float) -> None:
        self._flushed_text = self._text
        self._last_flush = now
        self.flush_count += 1

    def _close(self) -> None:
        self._mark_flushed(self._clock())
        self.closed = True

    def _check_open(self) -> None:
        if self.closed:
            raise StoreError(f"the stream of message {self.message_id} has already ended")
