"""The store off the GUI thread: calls in order on one worker, a search beside it."""

from __future__ import annotations

import asyncio
import threading

import pytest

from pagoda.app.components.shared.async_store import AsyncStore
from pagoda.app.store import ConversationStore

WAIT_S = 5.0


async def test_store_calls_made_during_a_long_search_do_not_wait_for_it(
        store: ConversationStore, db: AsyncStore, monkeypatch: pytest.MonkeyPatch) -> None:
    cid = store.create_conversation("Logs").id
    store.append_user_message(cid, "worker started")
    searching, release = threading.Event(), threading.Event()
    real_search = store.search

    def long_search(*args, **kwargs):
        searching.set()
        release.wait(WAIT_S * 2)
        return real_search(*args, **kwargs)

    monkeypatch.setattr(store, "search", long_search)
    search = asyncio.ensure_future(db.search("worker"))
    try:
        assert await asyncio.to_thread(searching.wait, WAIT_S)
        await asyncio.wait_for(db.rename(cid, "Server logs"), WAIT_S)
        assert (await db.get_conversation(cid)).title == "Server logs"
    finally:
        release.set()
    assert [hit.message_id for hit in await search] == [store.current_path(cid)[0].id]


async def test_a_search_sees_what_was_written_before_it(store: ConversationStore,
                                                        db: AsyncStore) -> None:
    cid = store.create_conversation().id
    for n in range(20):
        db.submit(lambda s, n=n: s.append_user_message(cid, f"note {n} about the harbour"))
    hits = await db.search("harbour")
    assert len(hits) == 20
