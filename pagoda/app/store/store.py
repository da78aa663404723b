"""ConversationStore: the only code that opens a database session. Plain dataclasses out."""

import heapq
import json
import logging
import sqlite3
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, Self

from sqlalchemy import Engine, delete, func, select, text, update
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.orm import Session, sessionmaker

from . import convert
from .database import migrate, recovery
from .database.connection import create_store_engine, read_only
from .database.location import prepare_location, resolve_db_path
from .database.lock import DatabaseLock
from .documents import attachments, folders, images
from .errors import (
    ConversationNotFound,
    DatabaseLocationError,
    MessageNotFound,
    StoreError,
    reason_of,
)
from .records import (
    TOOL_OUTCOMES,
    Attachment,
    AttachmentChunk,
    ChunkHit,
    Citation,
    Conversation,
    Folder,
    FolderFile,
    GenerationStats,
    Message,
    MessageImage,
    NewAttachment,
    NewImage,
    ReplyParts,
    SamplingSettings,
    SearchHit,
    Thread,
    ToolCall,
)
from .schema import (
    AttachmentRow,
    ConversationRow,
    LeafRow,
    MessageRow,
    OpenTabRow,
    SettingRow,
)
from .search import search, vectors
from .titles import auto_title, imported_title
from .transfer import transfer

log = logging.getLogger(__name__)

_UNSET: Any = object()
KEEPABLE_ID_LIMIT = 2**53
DEFAULT_MARKERS = ("<b>", "</b>")


def _now() -> datetime:
    return datetime.now(UTC)


class ConversationStore:
    """Conversations, their message trees, settings and open tabs in one SQLite file.

    Safe to share between threads: every call runs its own short transaction.
    """

    def __init__(
        self,
        path: Path,
        engine: Engine,
        *,
        recovered_from: Path | None = None,
        backup_path: Path | None = None,
        lock: DatabaseLock | None = None,
    ) -> None:
        self.path = path
        self.recovered_from = recovered_from
        self.backup_path = backup_path
        self._engine = engine
        self._lock = lock
        self._write_sessions = sessionmaker(bind=engine, expire_on_commit=False)
        self._read_sessions = sessionmaker(bind=read_only(engine), expire_on_commit=False)

    # -- opening and closing -------------------------------------------------------------

    @classmethod
    def open(cls, path: Path | str | None = None) -> Self:
        """Open (creating, recovering or upgrading as needed) the database at `path`.

        `None` means $PAGODA_DB, else `pagoda.db` in the user data directory. A path that
        cannot hold the database raises `DatabaseLocationError`, naming it and the fix; a
        database another process has open raises `DatabaseInUseError`, before anything in it
        is read or changed. The store holds the database's lock until `close`.
        """
        db_path = resolve_db_path(path)
        try:
            return cls._open(db_path)
        except (OSError, sqlite3.Error, SQLAlchemyError) as error:
            raise DatabaseLocationError(db_path, reason_of(error)) from error

    @classmethod
    def _open(cls, path: Path) -> Self:
        prepare_location(path)
        # Before any recovery: a reply still streaming in another process is live, not
        # left over from a crash, and its file is not ours to move aside or upgrade.
        lock = DatabaseLock.acquire(path)
        try:
            recovered_from = recovery.move_aside_if_damaged(path)
            backup_path = migrate.migrate_to_head(path)
        except BaseException:
            lock.release()
            raise
        store = cls(
            path,
            create_store_engine(path),
            recovered_from=recovered_from,
            backup_path=backup_path,
            lock=lock,
        )
        try:
            store._interrupt_leftover_streams()
        except BaseException:
            store.close()
            raise
        return store

    def _interrupt_leftover_streams(self) -> None:
        with self._writing() as s:
            result = s.execute(
                update(MessageRow)
                .where(MessageRow.status == "streaming")
                .values(status="interrupted")
            )
        if result.rowcount:
            log.warning("marked %d reply(s) cut off by the last exit interrupted", result.rowcount)

    def close(self) -> None:
        self._engine.dispose()
        if self._lock is not None:
            self._lock.release()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    @contextmanager
    def _writing(self) -> Iterator[Session]:
        with self._write_sessions() as s, s.begin():
            yield s

    @contextmanager
    def _reading(self) -> Iterator[Session]:
        with self._read_sessions() as s, s.begin():
            yield s

    # -- conversations -------------------------------------------------------------------

    def create_conversation(
        self,
        title: str | None = None,
        model: str | None = None,
        system_prompt: str | None = None,
        sampling: SamplingSettings | None = None,
    ) -> Conversation:
        now = _now()
        row = ConversationRow(
            title=title,
            created_at=now,
            updated_at=now,
            model=model,
            system_prompt=system_prompt,
            sampling=convert.sampling_json(sampling or SamplingSettings()),
            pinned=False,
            archived=False,
        )
        with self._writing() as s:
            s.add(row)
            s.flush()
            return convert.to_conversation(row, None)

    def get_conversation(self, cid: int) -> Conversation:
        with self._reading() as s:
            return convert.to_conversation(_conversation_row(s, cid), _leaf_id(s, cid))

    def list_conversations(self, include_archived: bool = False) -> list[Conversation]:
        """Not deleted; pinned first, then by the user's last activity (a message sent or
        edited, a reply asked for again or continued): a reply's streaming, its tool results
        and its end move no chat, so the list keeps still while replies are written."""
        query = (
            select(ConversationRow, LeafRow.message_id)
            .outerjoin(LeafRow, LeafRow.conversation_id == ConversationRow.id)
            .where(ConversationRow.deleted_at.is_(None))
            .order_by(
                ConversationRow.pinned.desc(),
                ConversationRow.updated_at.desc(),
                ConversationRow.id.desc(),
            )
        )
        if not include_archived:
            query = query.where(ConversationRow.archived.is_(False))
        with self._reading() as s:
            return [convert.to_conversation(row, leaf) for row, leaf in s.execute(query)]

    def rename(self, cid: int, title: str) -> None:
        self._set_conversation_fields(cid, title=title.strip() or None)

    def set_pinned(self, cid: int, pinned: bool) -> None:
        self._set_conversation_fields(cid, pinned=pinned)

    def set_archived(self, cid: int, archived: bool) -> None:
        self._set_conversation_fields(cid, archived=archived)

    def delete(self, cid: int) -> None:
        """Soft delete: hidden from lists and search until `undo_delete` or a purge."""
        self._set_conversation_fields(cid, deleted_at=_now())

    def undo_delete(self, cid: int) -> None:
        self._set_conversation_fields(cid, deleted_at=None)

    def update_settings(
        self,
        cid: int,
        *,
        system_prompt: str | None = _UNSET,
        sampling: SamplingSettings = _UNSET,
        model: str | None = _UNSET,
    ) -> None:
        changes: dict[str, Any] = {"updated_at": _now()}
        if system_prompt is not _UNSET:
            changes["system_prompt"] = system_prompt
        if sampling is not _UNSET:
            changes["sampling"] = convert.sampling_json(sampling)
        if model is not _UNSET:
            changes["model"] = model
        self._set_conversation_fields(cid, **changes)

    def purge(self, cid: int) -> None:
        """Delete for good, with every message."""
        with self._writing() as s:
            s.delete(_conversation_row(s, cid))

    def deleted_conversation_ids(self) -> list[int]:
        """The soft-deleted conversations, not purged yet."""
        query = select(ConversationRow.id).where(ConversationRow.deleted_at.is_not(None))
        with self._reading() as s:
            return list(s.scalars(query.order_by(ConversationRow.id)))

    def purge_deleted(self, older_than: timedelta | None = None) -> int:
        """Purge soft-deleted conversations (deleted more than `older_than` ago); returns the count."""
        query = delete(ConversationRow).where(ConversationRow.deleted_at.is_not(None))
        if older_than is not None:
            query = query.where(ConversationRow.deleted_at <= _now() - older_than)
        with self._writing() as s:
            return s.execute(query).rowcount

    def _set_conversation_fields(self, cid: int, **values: Any) -> None:
        with self._writing() as s:
            row = _conversation_row(s, cid)
            for name, value in values.items():
                setattr(row, name, value)

    # -- messages and branches -----------------------------------------------------------

    def get_message(self, mid: int) -> Message:
        with self._reading() as s:
            return convert.to_message(_message_row(s, mid))

    def messages(self, cid: int) -> list[Message]:
        """Every message of the conversation, all branches, oldest first, with its images."""
        with self._reading() as s:
            _conversation_row(s, cid)
            return _with_images(s, [convert.to_message(row) for row in _all_message_rows(s, cid)])

    def append_user_message(self, cid: int, content: str,
                            new_images: Sequence[NewImage] = ()) -> Message:
        """A child of the current leaf that becomes the leaf, with its images (all kept, or
        none and nothing: ImageRefusedError names the one past a bound); titles an untitled
        conversation."""
        with self._writing() as s:
            conversation = _conversation_row(s, cid)
            row = _add_message(s, conversation, _leaf_id(s, cid), "user", content)
            kept = images.add(s, row, new_images) if new_images else []
            if conversation.title is None:
                conversation.title = auto_title(content)
            return replace(convert.to_message(row), images=tuple(kept))

    def start_assistant_message(
        self, cid: int, parent_id: int | None = None, model: str | None = None
    ) -> Message:
        """An empty 'streaming' reply under `parent_id` (default: the leaf); it becomes the leaf.

        A parent that already has a reply gets a second one: that is a regeneration.
        """
        with self._writing() as s:
            conversation = _conversation_row(s, cid)
            if parent_id is None:
                parent_id = _leaf_id(s, cid)
            else:
                _check_in_conversation(_message_row(s, parent_id), cid)
            return convert.to_message(_start_reply(s, conversation, parent_id, model))

    def resume_message(self, mid: int) -> Message:
        """Reopen a reply cut at its max tokens (finish reason "length"), or stopped or
        interrupted, to stream its rest: it becomes 'streaming' again, keeping its text. Only
        the newest message of its branch can be continued."""
        with self._writing() as s:
            row = _message_row(s, mid)
            _check_role(row, "assistant")
            cut = row.status == "complete" and row.finish_reason == "length"
            if not (cut or row.status == "interrupted") or row.tool_calls:
                raise StoreError(f"message {mid} was not cut at its max tokens nor stopped: "
                                 "only such a reply can be continued")
            if _leaf_id(s, row.conversation_id) != mid:
                raise StoreError(f"message {mid} is not the newest of its branch")
            row.status = "streaming"
            row.finish_reason = None
            _conversation_row(s, row.conversation_id).updated_at = _now()
            return convert.to_message(row)

    def update_streaming(self, mid: int, content: str, reasoning: str | None = None) -> None:
        """The reply so far; `reasoning` (None: unchanged) the model's thinking so far."""
        with self._writing() as s:
            row = _message_row(s, mid)
            _check_streaming(row)
            row.content = content
            if reasoning is not None:
                row.reasoning = reasoning

    def finish_message(
        self,
        mid: int,
        content: str,
        finish_reason: str,
        stats: GenerationStats | None = None,
        *,
        prompt_tokens: int | None = None,
        completion_tokens: int | None = None,
        parts: ReplyParts | None = None,
    ) -> None:
        """`parts`: the reply's reasoning and the calls it made, where it has any."""
        self._end_reply(mid, content, "complete", finish_reason, stats, prompt_tokens,
                        completion_tokens, parts)

    def interrupt_message(
        self,
        mid: int,
        content: str,
        finish_reason: str | None = None,
        stats: GenerationStats | None = None,
        *,
        prompt_tokens: int | None = None,
        completion_tokens: int | None = None,
        parts: ReplyParts | None = None,
    ) -> None:
        """Keep a reply cut short. `finish_reason` "stopped" when the user stopped it; None
        when something else did (the app closing, a model switch, a failure)."""
        self._end_reply(mid, content, "interrupted", finish_reason, stats, prompt_tokens,
                        completion_tokens, parts)

    def _end_reply(self, mid: int, content: str, status: str, finish_reason: str | None,
                   stats: GenerationStats | None, prompt_tokens: int | None,
                   completion_tokens: int | None, parts: ReplyParts | None) -> None:
        with self._writing() as s:
            row = self._end_stream(s, mid, content, status, parts)
            row.finish_reason = finish_reason
            row.prompt_tokens = prompt_tokens
            row.completion_tokens = completion_tokens
            if stats is not None:
                convert.apply_stats(row, stats)

    def fail_message(self, mid: int, content: str, error: str,
                     parts: ReplyParts | None = None) -> None:
        with self._writing() as s:
            self._end_stream(s, mid, content, "error", parts).error = error

    @staticmethod
    def _end_stream(s: Session, mid: int, content: str, status: str,
                    parts: ReplyParts | None = None) -> MessageRow:
        row = _message_row(s, mid)
        _check_streaming(row)
        row.content = content
        row.status = status
        if parts is not None:
            convert.apply_parts(row, parts)
        return row

    def append_tool_message(self, parent_id: int, call: ToolCall, content: str,
                            outcome: str) -> Message:
        """What the call `call` of the reply `parent_id` returned (or why it did not run), as a
        "tool" message under it that becomes the leaf. `outcome` is one of TOOL_OUTCOMES."""
        if outcome not in TOOL_OUTCOMES:
            raise StoreError(f"a tool call's outcome is one of {', '.join(TOOL_OUTCOMES)}, "
                             f"not {outcome!r}")
        with self._writing() as s:
            parent = _message_row(s, parent_id)
            if parent.role not in ("assistant", "tool"):
                raise StoreError(f"message {parent_id} is a {parent.role} message: a tool "
                                 "result follows the reply that called it")
            conversation = _conversation_row(s, parent.conversation_id)
            return convert.to_message(_add_message(
                s, conversation, parent_id, "tool", content, finish_reason=outcome,
                tool_call_id=call.id, tool_name=call.name))

    # -- attached documents --------------------------------------------------------------

    def add_attachment(self, message_id: int, document: NewAttachment) -> Attachment:
        """Keep `document` (its text and passages) as attached to the user message
        `message_id`; it goes with the message's conversation when that is deleted."""
        with self._writing() as s:
            return attachments.add(s, _message_row(s, message_id), document, _now())

    def add_images(self, message_id: int, new_images: Sequence[NewImage]) -> list[MessageImage]:
        """Keep `new_images` with the user message `message_id`, after those it has (all of
        them, or none: ImageRefusedError names the one past a bound)."""
        with self._writing() as s:
            return images.add(s, _message_row(s, message_id), new_images)

    def attachments(self, cid: int) -> list[Attachment]:
        """The conversation's documents, on every branch, oldest first."""
        with self._reading() as s:
            _conversation_row(s, cid)
            return attachments.of_conversation(s, cid)

    def attachment_text(self, attachment_id: int) -> str:
        return self.attachment_document(attachment_id).text

    def attachment_document(self, attachment_id: int,
                            with_chunks: bool = False) -> NewAttachment:
        """The document as attached: its text and page starts (and its passages, if asked)."""
        with self._reading() as s:
            return attachments.document_of(s, attachment_id, with_chunks=with_chunks)

    def attachment_chunks(self, attachment_id: int) -> list[AttachmentChunk]:
        with self._reading() as s:
            return attachments.chunks_of(s, attachment_id)

    def search_passages(self, attachment_ids: list[int], match: str | None, question: str = "",
                        limit: int = 8, ranked: Sequence[int] = ()) -> list[ChunkHit]:
        """The passages of those documents matching the FTS5 expression `match` (for the
        trigram index) or, for Chinese and Japanese, the character pairs of `question` (bm25),
        joined with `ranked` (passage ids ranked by meaning), best first; StoreError when the
        expression cannot be read."""
        with self._reading() as s:
            try:
                return attachments.search(s, attachment_ids, match, question, limit, ranked)
            except SQLAlchemyError as error:
                raise StoreError(f"the passage search {match[:80]!r} could not be run "
                                 f"({error.__cause__ or error})") from error

    # -- passages' vectors (embeddings) ---------------------------------------------------------

    def chunks_without_vectors(self, attachment_id: int, model: str,
                               limit: int) -> list[tuple[int, str]]:
        """(id, text) of up to `limit` of the document's passages that `model` has not
        embedded."""
        with self._reading() as s:
            return vectors.missing(s, attachment_id, model, limit)

    def add_chunk_vectors(self, model: str, rows: list[tuple[int, bytes]]) -> None:
        """Keep passages' vectors (float32 bytes) from the embedding model `model`."""
        with self._writing() as s:
            vectors.add(s, model, rows)

    def chunk_vectors(self, attachment_id: int, model: str) -> list[tuple[int, bytes]]:
        with self._reading() as s:
            return vectors.of_document(s, attachment_id, model)

    def set_sources(self, message_id: int, citations: tuple[Citation, ...]) -> None:
        """The passages the reply `message_id` was given to answer from."""
        with self._writing() as s:
            row = _message_row(s, message_id)
            _check_role(row, "assistant")
            row.sources = attachments.sources_json(citations)

    def edit_user_message(self, mid: int, new_content: str) -> Message:
        """A new sibling with the edited text, and the original's images, becomes the leaf; the
        old branch stays as it was."""
        with self._writing() as s:
            original = _message_row(s, mid)
            _check_role(original, "user")
            conversation = _conversation_row(s, original.conversation_id)
            row = _add_message(s, conversation, original.parent_id, "user", new_content)
            kept = images.of_messages(s, [mid]).get(mid, ())
            copied = images.add(s, row, [image.image for image in kept]) if kept else []
            return replace(convert.to_message(row), images=tuple(copied))

    def regenerate(self, assistant_mid: int) -> Message:
        """A new streaming reply next to `assistant_mid`, under the same user message."""
        with self._writing() as s:
            original = _message_row(s, assistant_mid)
            _check_role(original, "assistant")
            conversation = _conversation_row(s, original.conversation_id)
            conversation.updated_at = _now()
            return convert.to_message(_start_reply(s, conversation, original.parent_id, None))

    def siblings(self, mid: int) -> list[Message]:
        """The message and its alternatives (same parent), oldest first."""
        with self._reading() as s:
            row = _message_row(s, mid)
            query = _children_query(row.conversation_id, row.parent_id)
            return [convert.to_message(r) for r in s.scalars(query)]

    def switch_branch(self, mid: int) -> Message:
        """Show the branch through `mid`: the leaf becomes its newest deepest descendant."""
        with self._writing() as s:
            leaf = _message_row(s, mid)
            while (child := _newest_child(s, leaf)) is not None:
                leaf = child
            _set_leaf(s, leaf.conversation_id, leaf.id)
            return convert.to_message(leaf)

    def current_path(self, cid: int) -> list[Message]:
        """Root to leaf: the branch on screen and what the model is given."""
        with self._reading() as s:
            _conversation_row(s, cid)
            by_id = {row.id: row for row in _all_message_rows(s, cid)}
            path: list[Message] = []
            mid = _leaf_id(s, cid)
            while mid is not None:
                row = by_id[mid]
                path.append(convert.to_message(row))
                mid = row.parent_id
            return _with_images(s, path[::-1])

    # -- search --------------------------------------------------------------------------

    def search(
        self,
        query: str,
        limit: int = 50,
        *,
        markers: tuple[str, str] = DEFAULT_MARKERS,
        escape_html: bool = True,
    ) -> list[SearchHit]:
        """Messages containing every term of `query`, newest first, with a marked snippet.

        The snippet text is HTML-escaped unless `escape_html` is False; hits are wrapped in
        `markers`. Deleted conversations are left out.
        """
        terms = search.search_terms(query)
        if not terms:
            return []
        with self._reading() as s:
            if search.needs_substring_scan(terms):
                found = self._substring_hits(s, terms, limit)
            else:
                found = self._fts_hits(s, terms, limit)
            # Each text is read on its own, after the sort: the sort carries no text, and no
            # more than one message's text is held at a time.
            return [convert.to_search_hit((cid, title, mid, role, self._snippet(s, mid, terms),
                                           created), markers, escape_html)
                    for cid, title, mid, role, created in found]

    @staticmethod
    def _fts_hits(s: Session, terms: list[str], limit: int) -> list[tuple]:
        sql = text(
            """SELECT m.conversation_id, c.title, m.id, m.role, m.created_at
            FROM messages_fts
            JOIN messages AS m ON m.id = messages_fts.rowid
            JOIN conversations AS c ON c.id = m.conversation_id
            WHERE messages_fts MATCH :match AND c.deleted_at IS NULL
            ORDER BY m.created_at DESC, m.id DESC
            LIMIT :limit"""
        )
        return list(s.execute(sql, {"match": search.fts_match_expression(terms), "limit": limit}))

    @staticmethod
    def _substring_hits(s: Session, terms: list[str], limit: int) -> list[tuple]:
        query = (
            select(
                MessageRow.conversation_id,
                ConversationRow.title,
                MessageRow.id,
                MessageRow.role,
                MessageRow.created_at,
            )
            .join(ConversationRow, ConversationRow.id == MessageRow.conversation_id)
            .where(ConversationRow.deleted_at.is_(None))
            .order_by(MessageRow.created_at.desc(), MessageRow.id.desc())
            .limit(limit)
        )
        # instr() compares lengths, not C strings, so a NUL in a term or the text is matched
        # as itself; lower() folds ASCII case as LIKE would.
        for term in terms:
            query = query.where(func.instr(func.lower(MessageRow.content), func.lower(term)) > 0)
        return list(s.execute(query))

    @staticmethod
    def _snippet(s: Session, mid: int, terms: list[str]) -> str:
        content = s.scalar(select(MessageRow.content).where(MessageRow.id == mid))
        return search.snippet(content or "", terms)

    # -- a chat's folders ----------------------------------------------------------------

    def add_folder(self, cid: int, path: str) -> Folder:
        """A folder (an absolute path) the chat answers from; at most MAX_FOLDERS a chat, each
        once. Its files are added one by one with `put_folder_file`."""
        with self._writing() as s:
            return folders.add(s, _conversation_row(s, cid), path, _now())

    def folders(self, cid: int) -> list[Folder]:
        with self._reading() as s:
            _conversation_row(s, cid)
            return folders.of_conversation(s, cid)

    def remove_folder(self, folder_id: int) -> None:
        """The folder leaves its chat, with its files' documents, passages and index entries."""
        with self._writing() as s:
            folders.remove(s, folder_id)

    def folder_files(self, folder_id: int) -> list[FolderFile]:
        """What is indexed of the folder: each file's path in it, the mtime and size it was
        read at, its document's id and passages."""
        with self._reading() as s:
            return folders.files(s, folder_id=folder_id)

    def chat_folder_files(self, cid: int) -> list[FolderFile]:
        """What is indexed of all the chat's folders."""
        with self._reading() as s:
            return folders.files(s, cid=cid)

    def put_folder_file(self, folder_id: int, source_path: str, mtime_ns: int, size: int,
                        document: NewAttachment) -> FolderFile:
        """Keep `document` as the folder's file `source_path` (read at `mtime_ns` and `size`),
        replacing what was kept of that file, in one transaction."""
        with self._writing() as s:
            return folders.put_file(s, folder_id, source_path, mtime_ns, size, document, _now())

    def drop_folder_file(self, folder_id: int, source_path: str) -> None:
        """Forget the folder's file `source_path` (gone from the folder, or no longer read)."""
        with self._writing() as s:
            folders.drop_file(s, folder_id, source_path)

    # -- export and import ---------------------------------------------------------------

    def export_json(self, cids: list[int] | None = None) -> str:
        """Lossless JSON of the given conversations (default: all, deleted ones included)."""
        with self._reading() as s:
            if cids is None:
                cids = list(s.scalars(select(ConversationRow.id).order_by(ConversationRow.id)))
            threads = [self._thread(s, cid) for cid in cids]
        return transfer.threads_to_json(threads)

    def import_json(self, text: str) -> list[int]:
        """Add the conversations of an export; ids are kept where they are free. Returns new ids."""
        threads = transfer.threads_from_json(text)
        with self._writing() as s:
            # Only titles there before the import: an export restored into an empty database
            # keeps its titles, repeated ones too.
            taken = set(s.scalars(select(ConversationRow.title).distinct()))
            return [_import_thread(s, replace(thread.conversation,
                                              title=imported_title(thread.conversation.title,
                                                                   taken)), thread)
                    for thread in threads]

    def export_markdown(self, cid: int) -> str:
        """The current branch as Markdown."""
        return transfer.thread_to_markdown(self.get_conversation(cid), self.current_path(cid))

    @staticmethod
    def _thread(s: Session, cid: int) -> Thread:
        conversation = convert.to_conversation(_conversation_row(s, cid), _leaf_id(s, cid))
        messages = [convert.to_message(row) for row in _all_message_rows(s, cid)]
        return Thread(conversation, _with_images(s, messages), attachments.exported(s, cid))

    # -- app settings and open tabs ------------------------------------------------------

    def get_setting(self, key: str, default: Any = None) -> Any:
        with self._reading() as s:
            row = s.get(SettingRow, key)
            return default if row is None else json.loads(row.value)

    def set_setting(self, key: str, value: Any) -> None:
        try:
            encoded = json.dumps(value)
        except (TypeError, ValueError) as error:
            raise StoreError(
                f"setting {key!r}: value is not JSON-serializable ({error})"
            ) from error
        with self._writing() as s:
            s.merge(SettingRow(key=key, value=encoded))

    def save_open_tabs(self, cids: list[int], active: int | None) -> None:
        """Remember the tabs, in order, and which one is active, for the next start."""
        ordered = list(dict.fromkeys(cids))
        with self._writing() as s:
            for cid in ordered:
                _conversation_row(s, cid)
            s.execute(delete(OpenTabRow))
            for position, cid in enumerate(ordered):
                s.add(OpenTabRow(position=position, conversation_id=cid, active=cid == active))

    def load_open_tabs(self) -> tuple[list[int], int | None]:
        """The saved tabs that still exist (not deleted) and the active one."""
        query = (
            select(OpenTabRow.conversation_id, OpenTabRow.active)
            .join(ConversationRow, ConversationRow.id == OpenTabRow.conversation_id)
            .where(ConversationRow.deleted_at.is_(None))
            .order_by(OpenTabRow.position)
        )
        with self._reading() as s:
            rows = s.execute(query).all()
        active = next((cid for cid, is_active in rows if is_active), None)
        return [cid for cid, _ in rows], active


# -- queries inside a session --------------------------------------------------------------


def _conversation_row(s: Session, cid: int) -> ConversationRow:
    row = s.get(ConversationRow, cid)
    if row is None:
        raise ConversationNotFound(cid)
    return row


def _with_images(s: Session, messages: list[Message]) -> list[Message]:
    """The messages with the images kept with them."""
    found = images.of_messages(s, [m.id for m in messages])
    return [replace(m, images=found[m.id]) if m.id in found else m for m in messages]


def _message_row(s: Session, mid: int) -> MessageRow:
    row = s.get(MessageRow, mid)
    if row is None:
        raise MessageNotFound(mid)
    return row


def _leaf_id(s: Session, cid: int) -> int | None:
    leaf = s.get(LeafRow, cid)
    return None if leaf is None else leaf.message_id


def _set_leaf(s: Session, cid: int, mid: int) -> None:
    leaf = s.get(LeafRow, cid)
    if leaf is None:
        s.add(LeafRow(conversation_id=cid, message_id=mid))
    else:
        leaf.message_id = mid


def _all_message_rows(s: Session, cid: int) -> list[MessageRow]:
    query = select(MessageRow).where(MessageRow.conversation_id == cid).order_by(MessageRow.id)
    return list(s.scalars(query))


def _children_query(cid: int, parent_id: int | None):
    parent = (
        MessageRow.parent_id.is_(None) if parent_id is None else MessageRow.parent_id == parent_id
    )
    return (
        select(MessageRow)
        .where(MessageRow.conversation_id == cid, parent)
        .order_by(MessageRow.created_at, MessageRow.id)
    )


def _newest_child(s: Session, row: MessageRow) -> MessageRow | None:
    query = (
        select(MessageRow)
        .where(MessageRow.parent_id == row.id)
        .order_by(MessageRow.created_at.desc(), MessageRow.id.desc())
        .limit(1)
    )
    return s.scalars(query).first()


def _add_message(
    s: Session,
    conversation: ConversationRow,
    parent_id: int | None,
    role: str,
    content: str,
    **fields: Any,
) -> MessageRow:
    now = _now()
    row = MessageRow(
        conversation_id=conversation.id,
        parent_id=parent_id,
        role=role,
        content=content,
        created_at=now,
        status=fields.pop("status", "complete"),
        **fields,
    )
    s.add(row)
    s.flush()
    _set_leaf(s, conversation.id, row.id)
    if role == "user":  # the user's activity orders the list; a reply's messages do not
        conversation.updated_at = now
    return row


def _start_reply(
    s: Session, conversation: ConversationRow, parent_id: int | None, model: str | None
) -> MessageRow:
    return _add_message(
        s,
        conversation,
        parent_id,
        "assistant",
        "",
        status="streaming",
        gen_model=model if model is not None else conversation.model,
    )


def _check_in_conversation(row: MessageRow, cid: int) -> None:
    if row.conversation_id != cid:
        raise StoreError(
            f"message {row.id} belongs to conversation {row.conversation_id}, not {cid}"
        )


def _check_role(row: MessageRow, role: str) -> None:
    if row.role != role:
        raise StoreError(f"message {row.id} is a {row.role} message, expected a {role} message")


def _check_streaming(row: MessageRow) -> None:
    if row.status != "streaming":
        raise StoreError(f"message {row.id} is {row.status}, no longer streaming")


# -- import --------------------------------------------------------------------------------


def _import_thread(s: Session, conversation: Conversation, thread: Thread) -> int:
    """Add the thread as `conversation` (its title made distinct), with its messages, their
    documents, and the replies' sources pointed at those documents' new ids."""
    messages = thread.messages
    keep_ids = _ids_free(s, thread)
    row = ConversationRow(
        id=conversation.id if keep_ids else None,
        title=conversation.title,
        created_at=conversation.created_at,
        updated_at=conversation.updated_at,
        model=conversation.model,
        system_prompt=conversation.system_prompt,
        sampling=convert.sampling_json(conversation.sampling),
        pinned=conversation.pinned,
        archived=conversation.archived,
        deleted_at=conversation.deleted_at,
    )
    s.add(row)
    s.flush()
    new_ids: dict[int, int] = {}
    for message in _parents_first(messages):
        new_ids[message.id] = _import_message(s, row.id, message, new_ids, keep_ids)
    if conversation.leaf_id is not None:
        s.add(LeafRow(conversation_id=row.id, message_id=new_ids[conversation.leaf_id]))
    document_ids: dict[int, int] = {}
    for attached in thread.documents:
        message = s.get(MessageRow, new_ids[attached.message_id])
        added = attachments.add(s, message, attached.document, message.created_at,
                                attached.attachment_id if keep_ids else None)
        if attached.attachment_id is not None:
            document_ids[attached.attachment_id] = added.id
    for message in messages:
        if message.sources:
            s.get(MessageRow, new_ids[message.id]).sources = attachments.sources_json(
                _cited_in(message.sources, document_ids))
        if message.images:
            images.add(s, s.get(MessageRow, new_ids[message.id]),
                       [image.image for image in message.images],
                       [image.id for image in message.images] if keep_ids else ())
    return row.id


def _cited_in(citations: Sequence[Citation], document_ids: dict[int, int]) -> list[Citation]:
    """The citations with the imported documents' ids; 0 for a document the export did not
    hold (a file of the chat's folder): its passage opens as no longer kept."""
    return [replace(c, attachment_id=document_ids.get(c.attachment_id, 0)) for c in citations]


def _import_message(
    s: Session, cid: int, message: Message, new_ids: dict[int, int], keep_id: bool
) -> int:
    stats = message.stats or GenerationStats()
    row = MessageRow(
        id=message.id if keep_id else None,
        conversation_id=cid,
        parent_id=None if message.parent_id is None else new_ids[message.parent_id],
        role=message.role,
        content=message.content,
        created_at=message.created_at,
        status=message.status,
        finish_reason=message.finish_reason,
        error=message.error,
        prompt_tokens=message.prompt_tokens,
        completion_tokens=message.completion_tokens,
        gen_model=stats.model,
        ttft_s=stats.ttft_s,
        tokens_per_s=stats.tokens_per_s,
        cached_tokens=stats.cached_tokens,
        tool_call_id=message.tool_call_id,
        tool_name=message.tool_name,
    )
    convert.apply_parts(row, ReplyParts(message.reasoning, message.reasoning_s,
                                        message.tool_calls))
    s.add(row)
    s.flush()
    return row.id


def _parents_first(messages: list[Message]) -> list[Message]:
    """Parents before children, otherwise oldest (smallest id) first: new ids keep the order.

    The import's validation has made sure every parent is among `messages` and nothing cycles.
    """
    by_id = {m.id: m for m in messages}
    children: dict[int | None, list[int]] = {}
    for message in messages:
        children.setdefault(message.parent_id, []).append(message.id)
    ready = list(children.get(None, []))
    heapq.heapify(ready)
    ordered: list[Message] = []
    while ready:
        mid = heapq.heappop(ready)
        ordered.append(by_id[mid])
        for child in children.get(mid, []):
            heapq.heappush(ready, child)
    assert len(ordered) == len(messages), "validated: every message descends from a root"
    return ordered


def _ids_free(s: Session, thread: Thread) -> bool:
    """Whether the export's ids can be kept: all free, and low enough not to exhaust the
    AUTOINCREMENT counter that later conversations, messages and documents draw from."""
    conversation = thread.conversation
    ids = [m.id for m in thread.messages]
    document_ids = [d.attachment_id for d in thread.documents if d.attachment_id is not None]
    if max([conversation.id, *ids, *document_ids]) > KEEPABLE_ID_LIMIT:
        return False
    if s.get(ConversationRow, conversation.id) is not None:
        return False
    taken = s.scalars(select(MessageRow.id).where(MessageRow.id.in_(ids)).limit(1)).first()
    taken_document = s.scalars(select(AttachmentRow.id).where(AttachmentRow.id.in_(document_ids))
                               .limit(1)).first()
    image_ids = [image.id for m in thread.messages for image in m.images]
    if image_ids and max(image_ids) > KEEPABLE_ID_LIMIT:
        return False
    return taken is None and taken_document is None and not images.taken(s, image_ids)
