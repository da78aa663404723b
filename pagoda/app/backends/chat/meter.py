"""Generation speed measured where the tokens arrive: the client end of a remote stream."""

from __future__ import annotations

import time
from collections import deque

WINDOW_S = 5.0


class ThroughputMeter:
    """Tokens per second over the last few seconds, from the times tokens arrived.

    `add` is called on the event loop; `rate` from any thread (it reads a copy).
    """

    def __init__(self, window_s: float = WINDOW_S) -> None:
        self._window_s = window_s
        self._arrivals: deque[tuple[float, int]] = deque()

    def add(self, num_tokens: int, now: float | None = None) -> None:
        now = time.monotonic() if now is None else now
        self._arrivals.append((now, num_tokens))
        while self._arrivals and self._arrivals[0][0] < now - self._window_s:
            self._arrivals.popleft()

    def rate(self, now: float | None = None) -> float:
        """0 when fewer than two arrivals fall in the window: no speed can be told yet."""
        now = time.monotonic() if now is None else now
        recent = [a for a in list(self._arrivals) if a[0] >= now - self._window_s]
        if len(recent) < 2:
            return 0.0
        elapsed = recent[-1][0] - recent[0][0]
        tokens = sum(n for _, n in recent[1:])
        return tokens / elapsed if elapsed > 0 else 0.0
