"""A chat's folders in the database: the folders, and each one's files kept as documents with
no message (their passages searched like any attached document's). Functions of a session:
ConversationStore opens the sessions.

Deleting a folder's file deletes its passages (foreign keys cascade), and the passages' delete
trigger (revision 0004) takes them out of both search indexes."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import delete, func, select
from sqlalchemy.orm import Session

from ..errors import StoreError
from ..records import Folder, FolderFile, NewAttachment
from ..schema import AttachmentChunkRow, AttachmentRow, ChatFolderRow, ConversationRow
from . import attachments

MAX_FOLDERS = 8  # a chat's; each is up to a few thousand files searched at every question


def add(s: Session, conversation: ConversationRow, path: str, now: datetime) -> Folder:
    if not path.strip():
        raise StoreError("a folder needs a path")
    rows = list(s.scalars(select(ChatFolderRow)
                          .where(ChatFolderRow.conversation_id == conversation.id)))
    if any(row.path == path for row in rows):
        raise StoreError(f"{path} is already one of this chat's folders")
    if len(rows) >= MAX_FOLDERS:
        raise StoreError(f"a chat answers from at most {MAX_FOLDERS} folders: remove one from "
                         "this chat first")
    row = ChatFolderRow(conversation_id=conversation.id, path=path, added_at=now)
    s.add(row)
    s.flush()
    return _folder(row)


def of_conversation(s: Session, cid: int) -> list[Folder]:
    """The chat's folders, in the order they were added."""
    query = (select(ChatFolderRow).where(ChatFolderRow.conversation_id == cid)
             .order_by(ChatFolderRow.id))
    return [_folder(row) for row in s.scalars(query)]


def remove(s: Session, folder_id: int) -> None:
    """The folder goes, and its files' documents and passages with it."""
    s.delete(folder_row(s, folder_id))


def files(s: Session, *, folder_id: int | None = None, cid: int | None = None
          ) -> list[FolderFile]:
    """The files indexed from one folder, or from every folder of the chat `cid`."""
    passages = (select(func.count()).where(AttachmentChunkRow.attachment_id == AttachmentRow.id)
                .scalar_subquery())
    # Columns, not rows: a folder's documents' text stays in the database.
    query = (select(AttachmentRow.folder_id, AttachmentRow.source_path, AttachmentRow.mtime_ns,
                    AttachmentRow.file_size, AttachmentRow.id, AttachmentRow.kind, passages)
             .where(AttachmentRow.folder_id.is_not(None))
             .order_by(AttachmentRow.folder_id, AttachmentRow.source_path))
    if folder_id is not None:
        query = query.where(AttachmentRow.folder_id == folder_row(s, folder_id).id)
    if cid is not None:
        query = query.where(AttachmentRow.conversation_id == cid)
    return [FolderFile(*columns) for columns in s.execute(query)]


def put_file(s: Session, folder_id: int, source_path: str, mtime_ns: int, size: int,
             document: NewAttachment, now: datetime) -> FolderFile:
    """Keep the file `source_path` of the folder as `document`, in place of what was kept of
    it before (the caller's transaction makes the swap atomic)."""
    folder = folder_row(s, folder_id)
    drop_file(s, folder_id, source_path)
    row = attachments.document_row(document, now, conversation_id=folder.conversation_id,
                                   folder_id=folder_id, source_path=source_path,
                                   mtime_ns=mtime_ns, file_size=size)
    attachments.insert(s, row, document)
    return FolderFile(folder_id, source_path, mtime_ns, size, row.id, row.kind,
                      len(document.chunks))


def drop_file(s: Session, folder_id: int, source_path: str) -> None:
    """Forget the file `source_path` of the folder (nothing happens when it was not kept)."""
    s.execute(delete(AttachmentRow).where(AttachmentRow.folder_id == folder_id,
                                          AttachmentRow.source_path == source_path))


def folder_row(s: Session, folder_id: int) -> ChatFolderRow:
    row = s.get(ChatFolderRow, folder_id)
    if row is None:
        raise StoreError(f"no folder has id {folder_id}: it was removed from its chat")
    return row


def _folder(row: ChatFolderRow) -> Folder:
    return Folder(row.id, row.conversation_id, row.path, row.added_at)
