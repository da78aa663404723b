"""The open tabs, without a window: which chats are open, in what order, which one is current,
and each one's ChatSession. The store keeps the list, so the next start reopens it. No Qt."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING

from pagoda.app.components.chat.chat_session import ChatSession
from pagoda.app.components.chat.chat_sources import LOCAL, ChatSources, RemoteSource
from pagoda.app.components.settings.chat_defaults import load_chat_defaults
from pagoda.app.components.shared.async_store import AsyncStore
from pagoda.app.components.shared.tasks import TaskSet
from pagoda.app.components.shared.tool_seam import ChatTools
from pagoda.app.store import Conversation

if TYPE_CHECKING:
    from pagoda.app.components.documents.document_embeddings import DocumentEmbeddings

logger = logging.getLogger(__name__)

LOCAL_INSTEAD = ("This new chat answers from this computer: {server} could not be reached. "
                 "Choose it in the model picker once it runs again.")


class OpenChats:
    """`ids` in tab order, `current` (None when no chat is open), `sessions` by conversation id.

    Whoever shows the tabs listens: `on_opened(session)` (append a tab for it),
    `on_closed(conversation_id)` (remove it), `on_current(conversation_id)` (show it),
    `on_purged(conversation_id)` (an untouched new chat was closed and removed from the store).
    """

    def __init__(self, db: AsyncStore, sources: ChatSources,
                 tools: Callable[[], ChatTools | None] = lambda: None,
                 embeddings: DocumentEmbeddings | None = None) -> None:
        """`tools()` gives each chat opened the tools its model may call (None: none);
        `embeddings` ranks every chat's passages by meaning too."""
        self.db = db
        self._embeddings = embeddings
        self.sources = sources
        self._tools = tools
        self.ids: list[int] = []
        self.current: int | None = None
        self.sessions: dict[int, ChatSession] = {}
        self.on_opened: Callable[[ChatSession], None] = lambda _session: None
        self.on_closed: Callable[[int], None] = lambda _cid: None
        self.on_current: Callable[[int], None] = lambda _cid: None
        self.on_purged: Callable[[int], None] = lambda _cid: None
        self._restoring = False
        self._tasks = TaskSet(self._failed)

    @property
    def current_session(self) -> ChatSession | None:
        return self.sessions.get(self.current) if self.current is not None else None

    async def restore(self) -> None:
        """Reopen the tabs of the last session, in their order (or a new chat); new chats that
        a crash left empty and without a tab are removed."""
        self._restoring = True
        try:
            ids, active = await self.db.load_open_tabs()
            listed = await self.db.list_conversations()
            known = {c.id for c in listed}
            for cid in ids:
                if cid in known:
                    await self.open(cid)
            await self._remove_left_empty([c for c in listed if c.id not in self.sessions])
            if not self.ids:
                await self.new_chat()
            if active in self.sessions:
                self.select(active)
        finally:
            self._restoring = False
        await self.save()

    async def new_chat(self) -> ChatSession:
        """A new chat with the user's defaults for new chats, answered from where the current
        one is; from this computer instead (and said so in the chat) when that is a server
        that cannot be reached now (a quick look, PROBE_TIMEOUT_S at most)."""
        current = self.current_session
        down = current.source if current and await _unreachable(current.source) else None
        source_id = self.sources.id_of(current.source) if current and not down else LOCAL
        backend = self.sources.source(source_id).backend
        model = backend.model_name if backend is not None else None
        defaults = await load_chat_defaults(self.db)
        conversation = await self.db.create_conversation(
            model=model or None, system_prompt=defaults.system_prompt or None,
            sampling=defaults.sampling())
        if source_id != LOCAL:
            await self.sources.choose(conversation.id, source_id)
        session = await self.open(conversation.id)
        if down is not None:
            session.notify(LOCAL_INSTEAD.format(server=down.connection.label))
        return session

    async def open(self, cid: int) -> ChatSession:
        """Show the chat, opening a tab for it unless it has one."""
        if cid in self.sessions:
            self.select(cid)
            return self.sessions[cid]
        session = ChatSession(cid, self.db, self.sources.source(self.sources.chosen_for(cid)),
                              tools=self._tools())
        session.files.documents.embeddings = self._embeddings
        self.sessions[cid] = session
        self.ids.append(cid)
        self.on_opened(session)
        await session.open()
        self.select(cid, shown=True)
        return session

    def select(self, cid: int, *, shown: bool = False) -> None:
        """Make the chat the current one; `shown` tells the view again even if it already was
        (a tab just opened now has its settings to show)."""
        if cid not in self.sessions:
            return
        changed = cid != self.current
        self.current = cid
        if changed or shown:
            self.on_current(cid)
        if changed and not self._restoring:
            self._spawn(self.save())

    def move(self, ids: list[int]) -> None:
        """The tabs were dragged into this order."""
        if sorted(ids) == sorted(self.ids) and ids != self.ids:
            self.ids = list(ids)
            self._spawn(self.save())

    def close(self, cid: int) -> asyncio.Task | None:
        """Close the tab: its reply in progress is kept interrupted, an untouched new chat
        leaves nothing behind. Returns the task that finishes the closing (None if not open)."""
        session = self.sessions.pop(cid, None)
        if session is None:
            return None
        session.close()
        index = self.ids.index(cid)
        self.ids.remove(cid)
        if self.current == cid:
            self.current = self.ids[min(index, len(self.ids) - 1)] if self.ids else None
        self.on_closed(cid)
        if self.current is not None:
            self.on_current(self.current)
        return self._spawn(self._after_closed(session))

    def close_all(self) -> None:
        """For the app's exit: every reply in progress is kept (queued on the store's worker);
        the list of tabs stays as it was, for the next start."""
        for session in self.sessions.values():
            session.close()

    async def _after_closed(self, session: ChatSession) -> None:
        conversation = session.conversation
        if conversation is not None and not session.path and _untouched(session, conversation):
            await self.db.purge(conversation.id)
            self.on_purged(conversation.id)
        await self.save()

    async def _remove_left_empty(self, conversations: list[Conversation]) -> None:
        """Closing a new chat's tab removes it when nothing was written to it; one whose tab a
        crash (or a Pagoda before this rule) left behind is removed here."""
        for c in conversations:
            if c.leaf_id is None and not c.title and not await self.db.folders(c.id):
                await self.db.purge(c.id)

    def unlisted(self, conversation: Conversation) -> bool:
        """Whether the chat list leaves `conversation` out: a new chat open in a tab that
        nothing was written to yet (no message, title or folder), which closing its tab
        removes. It joins the list with its first message."""
        session = self.sessions.get(conversation.id)
        return (session is not None and conversation.leaf_id is None
                and _untouched(session, conversation))

    async def save(self) -> None:
        await self.db.save_open_tabs(list(self.ids), self.current)

    def save_now(self) -> None:
        """Queue the list on the store's worker without waiting (the app's exit drains it)."""
        ids, current = list(self.ids), self.current
        self.db.submit(lambda store: store.save_open_tabs(ids, current))

    async def wait_idle(self) -> None:
        await self._tasks.wait_idle()

    def _spawn(self, coro) -> asyncio.Task:
        return self._tasks.spawn(coro)

    @staticmethod
    def _failed(exc: BaseException) -> None:
        logger.error("saving the open tabs failed: %s", exc, exc_info=exc)


def _untouched(session: ChatSession, conversation: Conversation) -> bool:
    return not conversation.title and not session.files.folders.views


async def _unreachable(source: object) -> bool:
    if not isinstance(source, RemoteSource):
        return False
    return await source.probe() is not None
