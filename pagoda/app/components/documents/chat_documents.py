"""A chat's documents, without a window: the files waiting in the composer (read on a worker
thread, with progress), kept with the user's message when it is sent, and, for each reply, what
of the branch's documents the model is given: all of them, once, at the head of the prompt
where they fit the context (a prefix the prefix cache keeps from turn to turn), else the
passages retrieved for the question (bm25 over the store's index), numbered for the reply to
cite. A chat with folders (folder_index.py) always gets passages, from its folders' files and
the branch's documents together. No Qt."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING

from pagoda.app.backends import ChatMessage, TokenCount, ToolSpec
from pagoda.app.components.documents import (
    Chunk,
    Document,
    DocumentError,
    DocumentReader,
    Hit,
    Kind,
    ReadingCancelled,
    chunk_document,
    fts_query,
    passage_sources,
    read_document,
    reading_thread,
    retrieved_passages_message,
    whole_documents_message,
)
from pagoda.app.components.documents.passages.retrieval_query import search_terms
from pagoda.app.components.shared.async_store import AsyncStore
from pagoda.app.components.shared.view_models import AttachmentView, PassageView
from pagoda.app.store import (
    Attachment,
    AttachmentChunk,
    Citation,
    FolderFile,
    Message,
    NewAttachment,
)

if TYPE_CHECKING:
    from pagoda.app.components.documents.document_embeddings import DocumentEmbeddings

MAX_PENDING = 20  # files waiting in the composer at once
MAX_RANKED = 50  # passages ranked by meaning, joined with bm25's ranking
MAX_PASSAGES = 12  # retrieved for one question, before the budget cuts them
MAX_STAND_IN_CHUNKS = 4_000  # of the files waiting, looked at for the meter's count
# Of what the context leaves beside the chat and the reply, the share retrieved passages may take.
PASSAGE_SHARE = 0.5
ESTIMATED_CHARS_PER_TOKEN = 3  # to budget passages before the exact count of the whole prompt
PASSAGE_GONE = ("This passage is no longer in the chat: its document changed or was removed "
                "since this reply (a folder's file is read again when it changes).")

TokenCounter = Callable[[list[ChatMessage], Sequence[ToolSpec]], Awaitable[TokenCount]]

@dataclass(slots=True)
class _Pending:
    path: Path
    view: AttachmentView
    document: Document | None = None
    attachment: NewAttachment | None = None
    removed: bool = False  # by the user, while it may still be being read


@dataclass(slots=True, frozen=True)
class _Held:
    """A document the chat holds: stored (its attachment id), or waiting in the composer."""

    attachment_id: int | None
    name: str
    document: Document


@dataclass(slots=True, frozen=True)
class DocumentPrompt:
    """The chat's messages with its documents in them, the passages the reply may cite, and
    whether the documents went whole."""

    messages: list[ChatMessage]
    citations: tuple[Citation, ...] = ()
    whole: bool = False
    stand_ins: bool = False  # the meter's count: passages of files not yet sent stand in

    @property
    def has_documents(self) -> bool:
        return self.whole or bool(self.citations)


class ChatDocuments:
    """`views` (the files waiting in the composer), `reading` (one is being read);
    `on_pending_changed(views)` fires when they change."""

    def __init__(self, db: AsyncStore, read: DocumentReader = read_document) -> None:
        self.db = db
        self._read = read
        self._pending: list[_Pending] = []
        self._documents: dict[int, Document] = {}  # attached documents read back, by id
        self.on_pending_changed: Callable[[list[AttachmentView]], None] = lambda _views: None
        # What is indexed of the chat's folders (ChatFolders.documents); none without folders.
        self.folder_files: Callable[[], Awaitable[list[FolderFile]]] = _no_folder_files
        # Passages ranked by meaning too, where the window has an embedding server chosen.
        self.embeddings: DocumentEmbeddings | None = None

    # -- the composer's files --------------------------------------------------------------------

    @property
    def views(self) -> list[AttachmentView]:
        return [p.view for p in self._pending]

    @property
    def reading(self) -> str | None:
        """The name of a file still being read; None when none is."""
        return next((p.view.name for p in self._pending if p.view.state == "reading"), None)

    async def attach(self, paths: Sequence[str | Path]) -> None:
        """Read the files, one after another, off the event loop; a file that cannot be read
        stays in the list, failed, with why, until removed or sent past."""
        room = MAX_PENDING - len(self._pending)
        added = [_Pending(Path(p), AttachmentView(Path(p).name, state="reading"))
                 for p in list(paths)[:max(room, 0)]]
        refused = [Path(p).name for p in list(paths)[max(room, 0):]]
        self._pending += added
        self._pending += [_Pending(Path(name), AttachmentView(
            name, state="failed", error=f"at most {MAX_PENDING} files can wait to be sent"))
            for name in refused]
        self._changed()
        for pending in added:
            await self._read_one(pending)

    def remove(self, index: int) -> None:
        """The file leaves the composer; where it is being read, its reading is stopped."""
        if 0 <= index < len(self._pending):
            self._pending.pop(index).removed = True
            self._changed()

    def close(self) -> None:
        """The chat closes: every file still waiting is dropped and its reading stopped, so a
        long file does not hold the reading thread for a chat that is gone."""
        for pending in self._pending:
            pending.removed = True
        self._pending = []

    async def keep_with(self, message_id: int) -> list[Attachment]:
        """Store the files read with the user's message `message_id`; the list is emptied."""
        ready = [p.attachment for p in self._pending if p.attachment is not None]
        self._pending = []
        self._changed()
        stored = [await self.db.add_attachment(message_id, attachment) for attachment in ready]
        if self.embeddings is not None and stored:
            self.embeddings.index_soon([a.id for a in stored])
        return stored

    async def _read_one(self, pending: _Pending) -> None:
        loop = asyncio.get_running_loop()

        def progress(done: int, total: int) -> None:
            loop.call_soon_threadsafe(self._show_progress, pending, done, total)

        try:
            document, chunks = await loop.run_in_executor(
                reading_thread(), lambda: self._read_and_cut(pending, progress))
        except ReadingCancelled:
            return
        except DocumentError as exc:
            pending.view = replace(pending.view, state="failed", progress="", error=str(exc))
        except OSError as exc:
            pending.view = replace(pending.view, state="failed", progress="",
                                   error=f"{pending.path.name} could not be opened: "
                                         f"{exc.strerror or exc}")
        else:
            pending.document, pending.attachment = document, attachment_of(document, chunks)
            pending.view = AttachmentView(document.name, document.kind, document.size_bytes,
                                          document.pages)
        self._changed()

    def _read_and_cut(self, pending: _Pending, progress) -> tuple[Document, list[Chunk]]:
        if pending.removed:
            raise ReadingCancelled(pending.path.name)
        document = self._read(pending.path, progress, lambda: pending.removed)
        return document, chunk_document(document)

    def _show_progress(self, pending: _Pending, done: int, total: int) -> None:
        if pending.view.state == "reading" and pending in self._pending:
            pending.view = replace(pending.view, progress=f"page {done:,} / {total:,}")
            self._changed()

    def _changed(self) -> None:
        self.on_pending_changed(self.views)

    # -- what a reply is given -------------------------------------------------------------------

    async def prompt(self, messages: list[ChatMessage], path: Sequence[Message],
                     count: TokenCounter, tools: Sequence[ToolSpec], max_model_len: int,
                     max_tokens: int) -> DocumentPrompt:
        """`messages` (the branch as the model is given it) with the branch's documents: whole
        in the system message where the prompt then still leaves room for the reply, else the
        passages best matching the newest user message, above it. A chat with folders gets
        passages, from its folders' files and the branch's documents together."""
        held = await self._held(path)
        folder_files = await self.folder_files()
        if not held and not folder_files:
            return DocumentPrompt(messages)
        return await self._shaped(messages, held, count, tools, max_model_len, max_tokens,
                                  folder_files)

    async def counted(self, messages: list[ChatMessage], path: Sequence[Message],
                      count: TokenCounter, tools: Sequence[ToolSpec], max_model_len: int,
                      max_tokens: int) -> TokenCount:
        """What the chat with `messages` (a draft last, maybe) takes as a prompt with its
        documents, those waiting in the composer included: the context meter's count."""
        held = await self._held(path)
        waiting = [p for p in self._pending if p.document is not None]
        held += [_Held(None, p.view.name, p.document) for p in waiting]
        folder_files = await self.folder_files()
        if not held and not folder_files:
            return await count(messages, tools)
        draft = messages[-1].content if messages and messages[-1].role == "user" else None
        stand_ins = await asyncio.to_thread(_stand_ins, waiting, draft) if waiting else []
        shaped = await self._shaped(messages, held, count, tools, max_model_len, max_tokens,
                                    folder_files, stand_ins)
        counted = await count(shaped.messages, tools)
        # Passages of the files waiting stand in for those the question will find: a guess.
        return replace(counted, exact=False) if shaped.stand_ins else counted

    async def _shaped(self, messages: list[ChatMessage], held: list[_Held],
                      count: TokenCounter, tools: Sequence[ToolSpec], max_model_len: int,
                      max_tokens: int, folder_files: Sequence[FolderFile] = (),
                      stand_ins: Sequence[Hit] = ()) -> DocumentPrompt:
        reply_room = min(max_tokens, max_model_len // 4)
        if not folder_files:
            whole = await self._whole(messages, held, count, tools, max_model_len - reply_room)
            if whole is not None:
                return whole
        chat = await count(messages, tools)
        budget = int((max_model_len - chat.n - reply_room) * PASSAGE_SHARE)
        kinds = {h.attachment_id: h.document.kind for h in held if h.attachment_id is not None}
        kinds |= {f.attachment_id: f.kind for f in folder_files}
        return await self._retrieved(messages, kinds, budget, stand_ins)  # type: ignore[arg-type]

    @staticmethod
    async def _whole(messages: list[ChatMessage], held: list[_Held], count: TokenCounter,
                     tools: Sequence[ToolSpec], room: int) -> DocumentPrompt | None:
        """The documents whole in the system message, where the prompt then takes at most
        `room` tokens; None where it would take more."""
        whole = _with_system_text(messages, whole_documents_message([h.document for h in held]))
        if (await count(whole, tools)).n > room:
            return None
        stored = [h for h in held if h.attachment_id is not None]
        return DocumentPrompt(whole, tuple(Citation(i, h.attachment_id, h.name, 0)
                                           for i, h in enumerate(stored, 1)), whole=True)

    async def _retrieved(self, messages: list[ChatMessage], kinds: dict[int, Kind],
                         budget: int, stand_ins: Sequence[Hit] = ()) -> DocumentPrompt:
        """The passages of the documents `kinds` names that best answer the newest user
        message, above it, as many as `budget` (tokens) holds; `stand_ins` (the meter's count
        of files not yet stored) after them, above a message still to be written if none is."""
        question_at = max((i for i, m in enumerate(messages) if m.role == "user"), default=None)
        if question_at is None:
            if not stand_ins:
                return DocumentPrompt(messages)
            messages, question_at = [*messages, ChatMessage("user", "")], len(messages)
        question = messages[question_at].content
        ranked = (await self.embeddings.ranking(list(kinds), question, MAX_RANKED)
                  if self.embeddings is not None and kinds else [])
        found = await self.db.search_passages(list(kinds), fts_query(question), question,
                                              MAX_PASSAGES, ranked=ranked) if kinds else []
        candidates = [(Hit(hit.name, kinds[hit.attachment_id], _chunk(hit.chunk)),
                       hit.attachment_id) for hit in found]
        candidates += [(hit, None) for hit in stand_ins]
        chosen, ids, used = [], [], 0
        for hit, attachment_id in candidates[:MAX_PASSAGES]:
            cost = len(hit.chunk.text) // ESTIMATED_CHARS_PER_TOKEN + 16
            if used + cost > budget:
                break
            used += cost
            chosen.append(hit)
            ids.append(attachment_id)
        asked = f"{retrieved_passages_message(chosen)}\n\n{question}"
        shaped = [*messages[:question_at], replace(messages[question_at], content=asked),
                  *messages[question_at + 1:]]
        citations = tuple(Citation(s.number, aid, s.name, s.ordinal, s.page, hit.chunk.heading)
                          for s, hit, aid in zip(passage_sources(chosen), chosen, ids,
                                                 strict=True) if aid is not None)
        return DocumentPrompt(shaped, citations, stand_ins=None in ids)

    async def _held(self, path: Sequence[Message]) -> list[_Held]:
        """The documents on the branch, read back from the store once."""
        return [_Held(a.id, a.name, await self._document(a)) for a in await self._on_branch(path)]

    async def _on_branch(self, path: Sequence[Message]) -> list[Attachment]:
        if not path:
            return []
        on_branch = {m.id for m in path}
        every = await self.db.attachments(path[0].conversation_id)
        return [a for a in every if a.message_id in on_branch]

    async def _document(self, attachment: Attachment) -> Document:
        document = self._documents.get(attachment.id)
        if document is None:
            stored = await self.db.attachment_document(attachment.id)
            document = Document(stored.name, stored.kind, stored.size_bytes, stored.pages,
                                stored.text, stored.page_starts)  # type: ignore[arg-type]
            self._documents[attachment.id] = document
        return document

    # -- a cited passage -------------------------------------------------------------------------

    async def passage(self, citation: Citation) -> PassageView:
        chunks = await self.db.attachment_chunks(citation.attachment_id)
        chunk = next((c for c in chunks if c.ordinal == citation.ordinal), None)
        if chunk is None:
            return PassageView(citation.name, citation.page, None, PASSAGE_GONE)
        return PassageView(citation.name, chunk.page, chunk.heading, chunk.text)


def attachment_views(attachments: Sequence[Attachment]) -> dict[int, tuple[AttachmentView, ...]]:
    """The documents of each user message, by message id, as its chips show them."""
    views: dict[int, list[AttachmentView]] = {}
    for a in attachments:
        views.setdefault(a.message_id, []).append(
            AttachmentView(a.name, a.kind, a.size_bytes, a.pages))
    return {mid: tuple(v) for mid, v in views.items()}


async def _no_folder_files() -> list[FolderFile]:
    return []


def _with_system_text(messages: list[ChatMessage], text: str) -> list[ChatMessage]:
    """The documents go into the one system message, after the chat's own system prompt: most
    templates take a single system message, first."""
    if messages and messages[0].role == "system":
        first = messages[0]
        return [replace(first, content=f"{first.content}\n\n{text}"), *messages[1:]]
    return [ChatMessage("system", text), *messages]


def attachment_of(document: Document, chunks: list[Chunk]) -> NewAttachment:
    """A document read and cut, as the store keeps it."""
    return NewAttachment(document.name, document.kind, document.size_bytes, document.text,
                         tuple(AttachmentChunk(c.ordinal, c.text, c.page, c.heading, c.start)
                               for c in chunks), document.pages, document.page_starts)


def _stand_ins(waiting: Sequence[_Pending], question: str | None) -> list[Hit]:
    """The passages of the files waiting in the composer that stand in, in the meter's
    count, for those the question will find once they are stored: those holding its search
    terms, most terms first, as the store's search ranks them; with no question typed yet,
    their first passages. At most MAX_STAND_IN_CHUNKS passages are looked at."""
    hits = [Hit(p.view.name, p.document.kind, _chunk(chunk)) for p in waiting
            if p.attachment is not None for chunk in p.attachment.chunks]
    hits = hits[:MAX_STAND_IN_CHUNKS]
    if question is None:
        return hits[:MAX_PASSAGES]
    terms = search_terms(question)
    found = [(sum(term in text for term in terms), i) for i, text in
             enumerate(hit.chunk.text.lower() for hit in hits)]
    return [hits[i] for matched, i in sorted(found, key=lambda f: (-f[0], f[1]))
            if matched][:MAX_PASSAGES]


def _chunk(chunk: AttachmentChunk) -> Chunk:
    return Chunk(chunk.ordinal, chunk.text, chunk.page, chunk.heading, chunk.start)
