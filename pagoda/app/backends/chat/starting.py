"""Replies between the call to `stream` and their request reaching the backend."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager


class StartingReplies:
    """Remembers an abort that comes while a reply is still starting (its chat being tokenized,
    the server being asked about its model), so that Stop pressed then still stops it."""

    def __init__(self) -> None:
        self._starting: set[str] = set()
        self._aborted: set[str] = set()

    @contextmanager
    def starting(self, request_id: str) -> Iterator[None]:
        self._starting.add(request_id)
        try:
            yield
        except BaseException:
            self._aborted.discard(request_id)  # it never started: nothing is left to stop
            raise
        finally:
            self._starting.discard(request_id)

    def abort(self, request_id: str) -> None:
        if request_id in self._starting:
            self._aborted.add(request_id)

    def was_aborted(self, request_id: str) -> bool:
        """Whether `request_id` was aborted while starting; asked once, when it has started."""
        if request_id in self._aborted:
            self._aborted.discard(request_id)
            return True
        return False
