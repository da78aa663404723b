"""The store off the GUI thread: every call runs in order on one worker thread and is awaited."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, TypeVar

from pagoda.app.store import ConversationStore, SearchHit

T = TypeVar("T")
logger = logging.getLogger(__name__)


class AsyncStore:
    """`await db.append_user_message(cid, text)` runs `store.append_user_message` on the worker.

    One worker keeps writes in the order they were made: a streaming update can never land
    after the message's final text. A search runs on a thread of its own, so the calls made
    after it need not wait for it.
    """

    def __init__(self, store: ConversationStore) -> None:
        self.store = store
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="pagoda-store")
        self._searcher = ThreadPoolExecutor(max_workers=1, thread_name_prefix="pagoda-search")

    async def run(self, fn: Callable[[ConversationStore], T]) -> T:
        """Run several store calls together on the worker: fn receives the store."""
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._executor, fn, self.store)

    async def search(self, *args: Any, **kwargs: Any) -> list[SearchHit]:
        """`store.search`, once every call made before it has run (it sees what they wrote),
        on the search thread: reading many long messages takes a while, and the chat's own
        writes and reads go on meanwhile (SQLite's WAL lets them)."""
        await self.run(lambda _store: None)
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._searcher,
                                          lambda: self.store.search(*args, **kwargs))

    def submit(self, fn: Callable[[ConversationStore], object]) -> None:
        """Queue a write without waiting for it; a failure is logged."""
        future = self._executor.submit(fn, self.store)
        future.add_done_callback(_log_failure)

    def __getattr__(self, name: str) -> Callable[..., Any]:
        method = getattr(self.store, name)

        async def call(*args: Any, **kwargs: Any) -> Any:
            return await self.run(lambda _store: method(*args, **kwargs))

        return call

    def drain(self) -> None:
        """Wait for every queued call to finish (used at exit)."""
        self._executor.submit(lambda: None).result()

    def close(self) -> None:
        self._searcher.shutdown(wait=True)
        self._executor.shutdown(wait=True)
        self.store.close()


def _log_failure(future: Future) -> None:
    if not future.cancelled() and future.exception() is not None:
        logger.error("a queued store write failed", exc_info=future.exception())
