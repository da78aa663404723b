"""Where each chat's replies come from: the engine on this computer, or a saved server.

One `RemoteSource` (one OpenAIBackend, one HTTP client) per saved connection, shared by every
tab that uses it, made on first use. Which source each chat uses is one app setting
(`chat_sources`: conversation id -> connection id), so a reopened chat answers from the same
place. No Qt here."""

from __future__ import annotations

import asyncio
import logging
from concurrent.futures import ThreadPoolExecutor

from pagoda.app.backends import BackendError, ChatBackend, ModelLoadingError
from pagoda.app.backends.remote.endpoint import tls_context
from pagoda.app.backends.remote.openai_remote import OpenAIBackend
from pagoda.app.components.chat.seams import BackendSource
from pagoda.app.components.shared.connections import (
    ConnectionKeys,
    SavedConnections,
    ServerConnection,
    backend_for,
)

logger = logging.getLogger(__name__)

CHAT_SOURCES_SETTING = "chat_sources"
LOCAL = ""  # the id of the engine on this computer, where a connection id would be


async def _off_the_loop(fn) -> None:
    """On a thread of our own: the app's loop (qasync) would lend a QThread that must not
    outlive the QApplication."""
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="pagoda-sources") as pool:
        await asyncio.wrap_future(pool.submit(fn))


class RemoteSource:
    """A saved connection as a BackendSource: its backend is there from the start (it connects
    on the first request); a key that was lost gives every request the reason instead."""

    def __init__(self, connection: ServerConnection, keys: ConnectionKeys) -> None:
        self.connection = connection
        self._backend: OpenAIBackend | None = None
        self._error: BackendError | None = None
        try:
            self._backend = backend_for(connection, keys)
        except BackendError as exc:
            self._error = exc

    @property
    def backend(self) -> ChatBackend | None:
        return self._backend

    def backend_for_new_request(self) -> ChatBackend:
        if self._backend is None:
            raise ModelLoadingError(str(self._error))
        return self._backend

    @property
    def unreachable(self) -> str | None:
        """Why the server could not be reached when last asked; None when it answered then
        (or has not been asked yet)."""
        return self._backend.endpoint.unreachable if self._backend is not None else None

    async def probe(self) -> str | None:
        """Look whether the server is there now (`unreachable` afterwards says)."""
        return await self._backend.endpoint.probe() if self._backend is not None else None

    def shutdown(self) -> None:
        if self._backend is not None:
            self._backend.shutdown()


class ChatSources:
    """The sources a chat can use, and which one each chat uses.

    local: the engine host (a BackendSource). Unknown or removed connections fall back to it.
    """

    def __init__(self, local: BackendSource, saved: SavedConnections, db) -> None:
        self.local = local
        self.saved = saved
        self._db = db
        self._remote: dict[str, RemoteSource] = {}
        self._retired: list[RemoteSource] = []  # replaced, maybe still used by open chats
        self._by_chat: dict[int, str] = {}

    async def load(self) -> None:
        """The saved connections and each chat's choice, as last stored."""
        await self.saved.load()
        stored = await self._db.get_setting(CHAT_SOURCES_SETTING, {})
        if not isinstance(stored, dict):
            logger.warning("ignored a malformed %s setting", CHAT_SOURCES_SETTING)
            stored = {}
        self._by_chat = {int(cid): str(sid) for cid, sid in stored.items()
                         if str(cid).isdigit() and self.saved.get(str(sid)) is not None}
        if self.saved.list():  # built here, off the loop, not by a chat's first request
            await _off_the_loop(tls_context)

    def source(self, source_id: str) -> BackendSource:
        """The source with that id: LOCAL, or a saved connection's id."""
        connection = self.saved.get(source_id) if source_id != LOCAL else None
        if connection is None:
            return self.local
        if source_id not in self._remote:
            self._remote[source_id] = RemoteSource(connection, self.saved.keys)
        return self._remote[source_id]

    def id_of(self, source: BackendSource) -> str:
        return source.connection.id if isinstance(source, RemoteSource) else LOCAL

    def chosen_for(self, conversation_id: int) -> str:
        return self._by_chat.get(conversation_id, LOCAL)

    async def choose(self, conversation_id: int, source_id: str) -> None:
        """Remember that chat's source (LOCAL forgets it)."""
        if source_id == LOCAL:
            self._by_chat.pop(conversation_id, None)
        else:
            self._by_chat[conversation_id] = source_id
        await self._save_choices()

    async def remove(self, source_id: str) -> None:
        """Forget a saved server: its key, its backend, and every chat's choice of it (those
        chats answer from this computer again). Open chats should leave it first."""
        self._by_chat = {cid: sid for cid, sid in self._by_chat.items() if sid != source_id}
        await self._save_choices()
        remote = self._remote.pop(source_id, None)
        if remote is not None:
            remote.shutdown()
        await self.saved.remove(source_id)

    async def _save_choices(self) -> None:
        await self._db.set_setting(CHAT_SOURCES_SETTING,
                                   {str(k): v for k, v in self._by_chat.items()})

    def describe(self, source: BackendSource) -> str:
        """In words, for the tab: "SmolLM2-135M-Instruct · this computer"."""
        if isinstance(source, RemoteSource):
            return source.connection.label
        backend = source.backend
        return f"{backend.model_name} · {backend.location}" if backend else "no model loaded"

    def forget(self, source_id: str) -> None:
        """Drop the backend made for that connection (it was added again, maybe with a new key);
        chats already using it keep it until they choose again."""
        retired = self._remote.pop(source_id, None)
        if retired is not None:
            self._retired.append(retired)

    def shutdown(self) -> None:
        """Close every remote backend (their streams end, their HTTP clients close)."""
        for remote in [*self._remote.values(), *self._retired]:
            remote.shutdown()
        self._remote.clear()
        self._retired.clear()
