"""Documents' passages as vectors from a server's /v1/embeddings, for the window's every chat: the
setting (which saved server, which embedding model), the passages embedded in the background
after they are stored, and a question's ranking of passages by cosine, which retrieval joins
with bm25's. Off until a server is chosen; where the server cannot be reached, retrieval goes
on by words alone and `state` says why. No Qt.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

import numpy as np

from pagoda.app.backends import BackendError
from pagoda.app.backends.services.embeddings import MAX_TEXTS, EmbeddingModel, EmbeddingsClient
from pagoda.app.components.shared.tasks import TaskSet

if TYPE_CHECKING:
    from pagoda.app.components.shared.connections import SavedConnections

logger = logging.getLogger(__name__)

EMBEDDINGS_SETTING = "document_embeddings"
BATCH = min(32, MAX_TEXTS)  # passages a request while embedding in the background
QUESTION_TIMEOUT_S = 15.0  # a reply waits this long for its question's vector, then goes on
RETRY_AFTER_S = 60.0  # after a failed pass, the background waits this long before trying again
MAX_CACHED_DOCUMENTS = 256  # documents whose vectors stay in memory


class VectorStore(Protocol):
    async def get_setting(self, key: str, default: object = None) -> object: ...
    async def set_setting(self, key: str, value: object) -> None: ...
    async def chunks_without_vectors(self, attachment_id: int, model: str,
                                     limit: int) -> list[tuple[int, str]]: ...
    async def add_chunk_vectors(self, model: str, rows: list[tuple[int, bytes]]) -> None: ...
    async def chunk_vectors(self, attachment_id: int, model: str) -> list[tuple[int, bytes]]: ...


@dataclass(frozen=True, slots=True)
class EmbeddingsState:
    """What Settings → Documents shows: `text` in words, `error` when the last try failed."""

    text: str
    error: bool = False


@dataclass(frozen=True, slots=True)
class EmbeddingsChoice:
    """The setting: a saved server's id and the embedding model asked of it."""

    connection_id: str
    model: str


class DocumentEmbeddings:
    """`source` (None: off), `state`; `on_changed(state)` fires when it changes."""

    def __init__(self, db: VectorStore, connections: SavedConnections,
                 client: Callable[[EmbeddingModel], EmbeddingsClient] = EmbeddingsClient) -> None:
        self.db = db
        self.connections = connections
        self._client_for = client
        self.choice: EmbeddingsChoice | None = None
        self.source: EmbeddingModel | None = None
        self._client: EmbeddingsClient | None = None
        self.state = EmbeddingsState("off: passages are found by their words")
        self.on_changed: Callable[[EmbeddingsState], None] = lambda _state: None
        self._queue: list[int] = []  # documents waiting to be embedded
        self._embedded: set[tuple[int, str]] = set()  # (document, model) with every vector
        self._worker: asyncio.Task | None = None
        self._failed_at = 0.0
        self._vectors: dict[tuple[int, str], tuple[np.ndarray, np.ndarray]] = {}
        self._vectors_generation = 0  # bumped whenever _vectors changes
        self._joined: tuple[tuple, tuple[np.ndarray, np.ndarray]] | None = None
        self._tasks = TaskSet(lambda exc: logger.error("Embedding failed", exc_info=exc))

    # -- the setting -----------------------------------------------------------------------------

    async def load(self) -> None:
        """Read the setting (after the saved servers are loaded); a malformed one is off."""
        stored = await self.db.get_setting(EMBEDDINGS_SETTING, None)
        choice = _choice_of(stored)
        if stored is not None and choice is None:
            logger.warning("Ignoring the setting %r: not {connection, model}", EMBEDDINGS_SETTING)
        self._use(choice)

    async def choose(self, choice: EmbeddingsChoice | None) -> None:
        """Use (and keep) `choice`; None turns embeddings off. A server that is not saved, or
        no model name, is refused with ValueError."""
        if choice is not None:
            if self.connections.get(choice.connection_id) is None:
                raise ValueError("that server is not among the saved servers: add it first")
            if not choice.model.strip():
                raise ValueError("name the embedding model the server serves "
                                 "(for example nomic-embed-text)")
            choice = EmbeddingsChoice(choice.connection_id, choice.model.strip())
        await self.db.set_setting(EMBEDDINGS_SETTING, None if choice is None else {
            "connection": choice.connection_id, "model": choice.model})
        self._use(choice)

    async def try_it(self) -> str:
        """One short text embedded now: what the settings' Test button says. Raises
        BackendError with why it failed."""
        if self._client is None:
            raise BackendError("no embedding server is chosen")
        started = time.perf_counter()
        vectors = await self._client.embed(["How do documents answer a question?"])
        ms = (time.perf_counter() - started) * 1000
        return f"{vectors.shape[1]:,} numbers a vector, answered in {ms:,.0f} ms"

    def _use(self, choice: EmbeddingsChoice | None) -> None:
        connection = self.connections.get(choice.connection_id) if choice else None
        self.choice = choice if connection else None
        if choice is None or connection is None:
            self.source = self._client = None
            self._set_state(EmbeddingsState("off: passages are found by their words"))
            return
        self.source = EmbeddingModel(connection.base_url, choice.model,
                                     self.connections.keys.get(connection.id))
        self._client = self._client_for(self.source)
        self._failed_at = 0.0
        self._set_state(EmbeddingsState(f"{choice.model} at {connection.label}"))
        if self._queue:
            self._start_worker()

    # -- embedding in the background -------------------------------------------------------------

    def index_soon(self, attachment_ids: Sequence[int]) -> None:
        """Embed these documents' passages that have no vector from the chosen model yet."""
        key = self.source.key if self.source else ""
        self._queue += [i for i in attachment_ids
                        if i not in self._queue and (i, key) not in self._embedded]
        if self._client is not None and self._queue:
            self._start_worker()

    async def wait_idle(self) -> None:
        while self._worker is not None and not self._worker.done():
            await asyncio.shield(self._worker)
        await self._tasks.wait_idle()

    def close(self) -> None:
        if self._worker is not None:
            self._worker.cancel()

    def _start_worker(self) -> None:
        if self._worker is None or self._worker.done():
            if time.monotonic() - self._failed_at < RETRY_AFTER_S:
                return
            self._worker = self._tasks.spawn(self._embed_queue())

    async def _embed_queue(self) -> None:
        while self._queue and self._client is not None:
            attachment_id = self._queue[0]
            try:
                await self._embed_document(attachment_id, self._client)
            except BackendError as exc:
                self._failed_at = time.monotonic()
                self._set_state(EmbeddingsState(
                    f"passages not embedded, found by their words only: {exc}", error=True))
                return
            self._queue.remove(attachment_id)
        if self.choice is not None and not self._queue:
            self._set_state(EmbeddingsState(f"{self.choice.model}: every passage embedded"))

    async def _embed_document(self, attachment_id: int, client: EmbeddingsClient) -> None:
        key = client.source.key
        done = 0
        while missing := await self.db.chunks_without_vectors(attachment_id, key, BATCH):
            vectors = await client.embed([text for _, text in missing])
            await self.db.add_chunk_vectors(key, [
                (chunk_id, vectors[i].astype("<f4").tobytes())
                for i, (chunk_id, _) in enumerate(missing)])
            self._forget_vectors((attachment_id, key))
            done += len(missing)
            self._set_state(EmbeddingsState(f"{self.choice.model if self.choice else key}: "
                                            f"{done:,} passages embedded"))
        self._embedded.add((attachment_id, key))

    # -- a question's ranking --------------------------------------------------------------------

    async def ranking(self, attachment_ids: Sequence[int], question: str,
                      limit: int) -> list[int]:
        """The ids of the passages of these documents closest to `question`, best first; [] when
        embeddings are off, the server fails (state says so) or no passage has a vector yet
        (those are embedded in the background, for the next question)."""
        client = self._client
        if client is None or not attachment_ids or not question.strip():
            return []
        self.index_soon(attachment_ids)
        ids, matrix = await self._stored_vectors(attachment_ids, client.source.key)
        if not len(ids):
            return []
        try:
            async with asyncio.timeout(QUESTION_TIMEOUT_S):
                query = (await client.embed([question]))[0]
        except (BackendError, TimeoutError) as exc:
            why = str(exc) or f"no answer within {QUESTION_TIMEOUT_S:g} s"
            self._set_state(EmbeddingsState(f"the question was found by its words only: {why}",
                                            error=True))
            return []
        return _closest(ids, matrix, query, limit)

    async def _stored_vectors(self, attachment_ids: Sequence[int],
                              key: str) -> tuple[np.ndarray, np.ndarray]:
        """The documents' vectors as one matrix, kept for the next question while the same
        documents are asked about, all of them embedded whole and kept."""
        asked = (key, tuple(attachment_ids), self._vectors_generation)
        if self._joined is not None and self._joined[0] == asked:
            return self._joined[1]
        parts = [await self._vectors_of(a, key) for a in attachment_ids]
        if any(self._vectors.get((a, key)) is not p for a, p in zip(attachment_ids, parts)):
            asked = None  # some still being embedded: joined again next time
        full = [p for p in parts if len(p[0])]
        if not full:
            return np.zeros(0, dtype=np.int64), np.zeros((0, 0), dtype=np.float32)
        width = full[-1][1].shape[1]
        full = [p for p in full if p[1].shape[1] == width]  # a model changed under its name
        joined = np.concatenate([p[0] for p in full]), np.concatenate([p[1] for p in full])
        self._joined = None if asked is None else (
            (key, tuple(attachment_ids), self._vectors_generation), joined)
        return joined

    async def _vectors_of(self, attachment_id: int, key: str) -> tuple[np.ndarray, np.ndarray]:
        cached = self._vectors.get((attachment_id, key))
        if cached is None:
            rows = await self.db.chunk_vectors(attachment_id, key)
            cached = _matrix(rows)
            if (attachment_id, key) not in self._embedded:
                return cached  # still being embedded: read again next time
            if len(self._vectors) >= MAX_CACHED_DOCUMENTS:
                self._forget_vectors(next(iter(self._vectors)))
            self._vectors[(attachment_id, key)] = cached
            self._vectors_generation += 1
        return cached

    def _forget_vectors(self, document: tuple[int, str]) -> None:
        if self._vectors.pop(document, None) is not None:
            self._vectors_generation += 1

    def _set_state(self, state: EmbeddingsState) -> None:
        if state != self.state:
            self.state = state
            self.on_changed(state)


def _matrix(rows: list[tuple[int, bytes]]) -> tuple[np.ndarray, np.ndarray]:
    """Stored vectors as (ids, matrix); rows of another width than the most common are left out."""
    if not rows:
        return np.zeros(0, dtype=np.int64), np.zeros((0, 0), dtype=np.float32)
    widths = [len(blob) // 4 for _, blob in rows]
    width = max(set(widths), key=widths.count)
    kept = [(chunk_id, blob) for chunk_id, blob in rows if len(blob) == 4 * width]
    ids = np.array([chunk_id for chunk_id, _ in kept], dtype=np.int64)
    matrix = np.frombuffer(b"".join(blob for _, blob in kept), dtype="<f4").reshape(-1, width)
    return ids, matrix


def _closest(ids: np.ndarray, matrix: np.ndarray, query: np.ndarray, limit: int) -> list[int]:
    if matrix.shape[1] != query.shape[0]:
        return []  # vectors stored before the model behind this name changed width
    scores = matrix @ query
    count = min(limit, len(ids))
    best = np.argpartition(-scores, count - 1)[:count]
    return [int(ids[i]) for i in best[np.argsort(-scores[best])]]


def _choice_of(stored: object) -> EmbeddingsChoice | None:
    if not isinstance(stored, dict):
        return None
    connection, model = stored.get("connection"), stored.get("model")
    if not (isinstance(connection, str) and connection and isinstance(model, str) and model):
        return None
    return EmbeddingsChoice(connection, model)
