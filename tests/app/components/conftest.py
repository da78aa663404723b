"""A chat session over a real store in tmp_path and a scripted backend; no Qt, no engine.

`async def` tests run in a fresh event loop each (pytest-asyncio is not a dependency), cut off
after TEST_TIMEOUT_S so a hang fails instead of blocking the suite.
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path

import pytest

from pagoda.app.components.chat.chat_session import ChatSession
from pagoda.app.components.shared.async_store import AsyncStore
from pagoda.app.store import ConversationStore
from tests.app.components.fake_backend import FakeSource, RecordingView, ScriptedBackend

TEST_TIMEOUT_S = 10.0

Turns = list[tuple[str, str]]


@pytest.hookimpl(tryfirst=True)
def pytest_pyfunc_call(pyfuncitem: pytest.Function) -> bool | None:
    if not inspect.iscoroutinefunction(pyfuncitem.obj):
        return None
    args = {name: pyfuncitem.funcargs[name] for name in pyfuncitem._fixtureinfo.argnames}
    asyncio.run(asyncio.wait_for(pyfuncitem.obj(**args), TEST_TIMEOUT_S))
    return True


@pytest.fixture
def store(tmp_path: Path) -> Iterator[ConversationStore]:
    opened = ConversationStore.open(tmp_path / "pagoda.db")
    yield opened
    opened.close()


@pytest.fixture
def db(store: ConversationStore) -> Iterator[AsyncStore]:
    async_store = AsyncStore(store)
    yield async_store
    async_store.close()


@pytest.fixture
def backend() -> ScriptedBackend:
    return ScriptedBackend()


@pytest.fixture
def source(backend: ScriptedBackend) -> FakeSource:
    return FakeSource(backend)


@pytest.fixture
def view() -> RecordingView:
    return RecordingView()


def seed(store: ConversationStore, cid: int, turns: Turns) -> None:
    """Store finished turns as if they had been chatted: ("user", text), ("assistant", text)."""
    for role, text in turns:
        if role == "user":
            store.append_user_message(cid, text)
        else:
            reply = store.start_assistant_message(cid, model="fake-model")
            store.finish_message(reply.id, text, "stop")


@pytest.fixture
def open_chat(store: ConversationStore, db: AsyncStore, source: FakeSource,
              view: RecordingView) -> Callable[..., Awaitable[ChatSession]]:
    """`await open_chat(turns, system_prompt=...)`: a session on a new conversation holding
    those turns, opened as a tab opens it, showing on `view`."""

    async def open_session(turns: Turns | None = None, system_prompt: str | None = None) -> ChatSession:
        cid = store.create_conversation(system_prompt=system_prompt).id
        seed(store, cid, turns or [])
        session = ChatSession(cid, db, source, view)
        await session.open()
        return session

    return open_session


@pytest.fixture
def session(open_chat) -> ChatSession:
    """A session on a fresh, empty conversation, already opened."""
    return asyncio.run(open_chat())
