"""The ORM tables. Migrations in `migrations/versions` create exactly these."""

from datetime import UTC, datetime

from sqlalchemy import (
    CheckConstraint,
    DateTime,
    ForeignKey,
    Index,
    Integer,
    LargeBinary,
    String,
    Text,
    TypeDecorator,
    UniqueConstraint,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column, validates

from .sanitize import replace_lone_surrogates


class UTCDateTime(TypeDecorator[datetime]):
    """Stores naive UTC (SQLite has no time zones) and hands back aware UTC datetimes."""

    impl = DateTime
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            raise ValueError(f"naive datetime {value!r}: the store only accepts aware datetimes")
        return value.astimezone(UTC).replace(tzinfo=None)

    def process_result_value(self, value: datetime | None, dialect) -> datetime | None:
        return None if value is None else value.replace(tzinfo=UTC)


def _text_columns(*names: str):
    """A validator for a table's free-text columns: whatever is set is text SQLite can store."""

    @validates(*names)
    def clean(self, key: str, value: str | None) -> str | None:
        return None if value is None else replace_lone_surrogates(value)

    return clean


class Base(DeclarativeBase):
    pass


class ConversationRow(Base):
    __tablename__ = "conversations"
    __table_args__ = ({"sqlite_autoincrement": True},)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    title: Mapped[str | None] = mapped_column(Text)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime)
    updated_at: Mapped[datetime] = mapped_column(UTCDateTime, index=True)
    model: Mapped[str | None] = mapped_column(Text)
    system_prompt: Mapped[str | None] = mapped_column(Text)
    sampling: Mapped[str] = mapped_column(Text)  # SamplingSettings as JSON
    pinned: Mapped[bool] = mapped_column(default=False)
    archived: Mapped[bool] = mapped_column(default=False)
    deleted_at: Mapped[datetime | None] = mapped_column(UTCDateTime)

    _clean_text = _text_columns("title", "model", "system_prompt")


class MessageRow(Base):
    __tablename__ = "messages"
    __table_args__ = (
        CheckConstraint("role IN ('system', 'user', 'assistant', 'tool')", name="ck_messages_role"),
        CheckConstraint(
            "status IN ('complete', 'streaming', 'interrupted', 'error')", name="ck_messages_status"
        ),
        {"sqlite_autoincrement": True},
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    conversation_id: Mapped[int] = mapped_column(
        ForeignKey("conversations.id", ondelete="CASCADE"), index=True
    )
    parent_id: Mapped[int | None] = mapped_column(
        ForeignKey("messages.id", ondelete="CASCADE"), index=True
    )
    role: Mapped[str] = mapped_column(String(16))
    content: Mapped[str] = mapped_column(Text, default="")
    created_at: Mapped[datetime] = mapped_column(UTCDateTime)
    status: Mapped[str] = mapped_column(String(16), default="complete")
    finish_reason: Mapped[str | None] = mapped_column(Text)
    error: Mapped[str | None] = mapped_column(Text)
    prompt_tokens: Mapped[int | None]
    completion_tokens: Mapped[int | None]
    gen_model: Mapped[str | None] = mapped_column(Text)
    ttft_s: Mapped[float | None]
    tokens_per_s: Mapped[float | None]
    cached_tokens: Mapped[int | None]
    reasoning: Mapped[str | None] = mapped_column(Text)
    reasoning_s: Mapped[float | None]
    tool_calls: Mapped[str | None] = mapped_column(Text)  # [{"id", "name", "arguments"}] as JSON
    tool_call_id: Mapped[str | None] = mapped_column(Text)
    tool_name: Mapped[str | None] = mapped_column(Text)
    sources: Mapped[str | None] = mapped_column(Text)  # [Citation as an object] as JSON

    _clean_text = _text_columns("role", "content", "status", "finish_reason", "error", "gen_model",
                                "reasoning", "tool_calls", "tool_call_id", "tool_name")


class ChatFolderRow(Base):
    """A folder on this computer a chat answers from: its files are kept as attachments."""

    __tablename__ = "chat_folders"
    __table_args__ = (
        UniqueConstraint("conversation_id", "path", name="uq_chat_folders_path"),
        {"sqlite_autoincrement": True},
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    conversation_id: Mapped[int] = mapped_column(
        ForeignKey("conversations.id", ondelete="CASCADE"), index=True
    )
    path: Mapped[str] = mapped_column(Text)
    added_at: Mapped[datetime] = mapped_column(UTCDateTime)

    _clean_text = _text_columns("path")


class AttachmentRow(Base):
    """A document of a chat: attached to a user message, or a file of one of its folders
    (`source_path` inside it, with the modification time and size it had when read)."""

    __tablename__ = "attachments"
    __table_args__ = (
        CheckConstraint("(message_id IS NULL) != (folder_id IS NULL)", name="ck_attachments_owner"),
        Index("ix_attachments_folder_file", "folder_id", "source_path", unique=True),
        {"sqlite_autoincrement": True},
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    conversation_id: Mapped[int] = mapped_column(
        ForeignKey("conversations.id", ondelete="CASCADE"), index=True
    )
    message_id: Mapped[int | None] = mapped_column(
        ForeignKey("messages.id", ondelete="CASCADE"), index=True
    )
    folder_id: Mapped[int | None] = mapped_column(ForeignKey("chat_folders.id", ondelete="CASCADE"))
    source_path: Mapped[str | None] = mapped_column(Text)
    mtime_ns: Mapped[int | None]
    file_size: Mapped[int | None]
    name: Mapped[str] = mapped_column(Text)
    kind: Mapped[str] = mapped_column(Text)
    size_bytes: Mapped[int]
    pages: Mapped[int | None]
    page_starts: Mapped[str | None] = mapped_column(Text)  # [offset, ...] as JSON
    text: Mapped[str] = mapped_column(Text)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime)

    _clean_text = _text_columns("name", "kind", "text", "source_path")


class MessageImageRow(Base):
    """An image that came with a user's message: its encoded bytes as given (PNG, JPEG, WebP,
    GIF), its size in pixels, and its place among the message's images."""

    __tablename__ = "message_images"
    __table_args__ = ({"sqlite_autoincrement": True},)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    message_id: Mapped[int] = mapped_column(
        ForeignKey("messages.id", ondelete="CASCADE"), index=True
    )
    position: Mapped[int]
    name: Mapped[str] = mapped_column(Text)
    mime_type: Mapped[str] = mapped_column(Text)
    width: Mapped[int]
    height: Mapped[int]
    data: Mapped[bytes] = mapped_column(LargeBinary)

    _clean_text = _text_columns("name", "mime_type")


class AttachmentChunkRow(Base):
    """A passage of an attached document; indexed for search by `attachment_chunks_fts`."""

    __tablename__ = "attachment_chunks"
    __table_args__ = ({"sqlite_autoincrement": True},)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    attachment_id: Mapped[int] = mapped_column(ForeignKey("attachments.id", ondelete="CASCADE"),
                                               index=True)
    ordinal: Mapped[int]
    page: Mapped[int | None]
    heading: Mapped[str | None] = mapped_column(Text)
    start: Mapped[int]
    text: Mapped[str] = mapped_column(Text)

    _clean_text = _text_columns("heading", "text")


class LeafRow(Base):
    """Which branch a conversation shows: the message at the bottom of it."""

    __tablename__ = "conversation_leaves"

    conversation_id: Mapped[int] = mapped_column(
        ForeignKey("conversations.id", ondelete="CASCADE"), primary_key=True
    )
    message_id: Mapped[int] = mapped_column(ForeignKey("messages.id", ondelete="CASCADE"))


class SettingRow(Base):
    __tablename__ = "settings"

    key: Mapped[str] = mapped_column(Text, primary_key=True)
    value: Mapped[str] = mapped_column(Text)  # JSON

    _clean_text = _text_columns("key")


class OpenTabRow(Base):
    __tablename__ = "open_tabs"

    position: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=False)
    conversation_id: Mapped[int] = mapped_column(ForeignKey("conversations.id", ondelete="CASCADE"))
    active: Mapped[bool] = mapped_column(default=False)


class ChunkVectorRow(Base):
    """A passage's vector from one embedding model (float32 bytes), for retrieval beside bm25."""

    __tablename__ = "chunk_vectors"

    chunk_id: Mapped[int] = mapped_column(
        ForeignKey("attachment_chunks.id", ondelete="CASCADE"), primary_key=True)
    model: Mapped[str] = mapped_column(Text, primary_key=True)
    vector: Mapped[bytes] = mapped_column(LargeBinary)
