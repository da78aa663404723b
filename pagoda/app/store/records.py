"""Plain data handed to callers of the store: no sessions, no ORM objects."""

from dataclasses import dataclass, field
from datetime import datetime
from typing import Literal

from pagoda.engine.sampling.fields import with_sampling_fields

Role = Literal["system", "user", "assistant", "tool"]
Status = Literal["complete", "streaming", "interrupted", "error"]
ROLES: tuple[str, ...] = ("system", "user", "assistant", "tool")
# How a tool message's call went (its finish_reason): it ran, the user denied it, or it failed
# (the server would not start, crashed, timed out or said the call failed). The message's
# content is what the model was told either way.
TOOL_OUTCOMES: tuple[str, ...] = ("done", "denied", "failed")
STATUSES: tuple[str, ...] = ("complete", "streaming", "interrupted", "error")


@dataclass(slots=True, frozen=True)
@with_sampling_fields(chat=True)
class SamplingSettings:
    """A chat's settings, kept as JSON in its row: the sampling knobs first, one field per row
    of pagoda.engine.sampling.fields at a new chat's value (a row added there is read as its
    value from rows saved before it), then these."""

    max_tokens: int = 1024
    seed: int | None = None
    # The chat template's thinking switch: None leaves the model's default.
    enable_thinking: bool | None = None
    # The tools this chat may call: "server" for all of an MCP server's tools, "server/tool"
    # for one of them (the tools settings name the servers).
    tools: tuple[str, ...] = ()


@dataclass(slots=True, frozen=True)
class GenerationStats:
    model: str | None = None
    ttft_s: float | None = None
    tokens_per_s: float | None = None
    cached_tokens: int | None = None


@dataclass(slots=True, frozen=True)
class ToolCall:
    """One call an assistant's reply made: `arguments` is the JSON text the model wrote."""

    id: str
    name: str
    arguments: str


@dataclass(slots=True, frozen=True)
class ReplyParts:
    """What a reply holds besides its answer: the model's reasoning (None: none), how long it
    reasoned, and the calls it made."""

    reasoning: str | None = None
    reasoning_s: float | None = None
    tool_calls: tuple[ToolCall, ...] = ()


@dataclass(slots=True, frozen=True)
class AttachmentChunk:
    """A passage of an attached document: its place among the document's passages, its text,
    the page it starts on (None: a document without pages) and the heading above it."""

    ordinal: int
    text: str
    page: int | None = None
    heading: str | None = None
    start: int = 0  # where it begins in the document's text


@dataclass(slots=True, frozen=True)
class NewAttachment:
    """A document to attach: what it is, its text (Markdown) and its passages."""

    name: str
    kind: str
    size_bytes: int
    text: str
    chunks: tuple[AttachmentChunk, ...]
    pages: int | None = None
    page_starts: tuple[int, ...] = ()  # where each page begins in `text` (none without pages)


@dataclass(slots=True, frozen=True)
class Attachment:
    """A document attached to a chat, with the user message it came with (its text is read
    with `attachment_text`)."""

    id: int
    conversation_id: int
    message_id: int
    name: str
    kind: str
    size_bytes: int
    pages: int | None
    num_chunks: int
    created_at: datetime


@dataclass(slots=True, frozen=True)
class NewImage:
    """An image to keep with a user's message: a name to show ("photo.jpg", "pasted image"),
    its type (image/png, image/jpeg, image/webp, image/gif), its size in pixels and its bytes."""

    name: str
    mime_type: str
    width: int
    height: int
    data: bytes = field(repr=False)


@dataclass(slots=True, frozen=True)
class MessageImage:
    """An image kept with a message, under its id."""

    id: int
    message_id: int
    image: NewImage


@dataclass(slots=True, frozen=True)
class Folder:
    """A folder on this computer a chat answers from (`path`, absolute)."""

    id: int
    conversation_id: int
    path: str
    added_at: datetime


@dataclass(slots=True, frozen=True)
class FolderFile:
    """A file of a chat's folder, as indexed: its path inside the folder ("/" between parts),
    the modification time and size it had when it was read, and its document (an attachment
    with no message: `attachment_id`, what it is, how many passages)."""

    folder_id: int
    source_path: str
    mtime_ns: int
    size: int
    attachment_id: int
    kind: str
    num_chunks: int


@dataclass(slots=True, frozen=True)
class ChunkHit:
    """A passage found for a question, best first: `score` is FTS5's bm25 (lower is better)."""

    chunk_id: int
    attachment_id: int
    name: str
    chunk: AttachmentChunk
    score: float


@dataclass(slots=True, frozen=True)
class Citation:
    """A passage a reply was given, as it cites it ([number]): the document, and the page and
    heading the passage is under (which tell apart several passages of one document)."""

    number: int
    attachment_id: int
    name: str
    ordinal: int
    page: int | None = None
    heading: str | None = None


@dataclass(slots=True, frozen=True)
class Conversation:
    id: int
    title: str | None
    created_at: datetime
    updated_at: datetime
    model: str | None
    system_prompt: str | None
    sampling: SamplingSettings
    pinned: bool
    archived: bool
    deleted_at: datetime | None
    leaf_id: int | None


@dataclass(slots=True, frozen=True)
class Message:
    id: int
    conversation_id: int
    parent_id: int | None
    role: Role
    content: str
    created_at: datetime
    status: Status
    finish_reason: str | None
    prompt_tokens: int | None
    completion_tokens: int | None
    stats: GenerationStats | None
    error: str | None = None
    # An assistant's reasoning before its answer (None: it gave none) and how long it took.
    reasoning: str | None = None
    reasoning_s: float | None = None
    # The calls an assistant's reply made; a "tool" message answers the call `tool_call_id`
    # of the function `tool_name`.
    tool_calls: tuple[ToolCall, ...] = ()
    tool_call_id: str | None = None
    tool_name: str | None = None
    # The passages of the chat's documents a reply was given to answer from, as it cites them.
    sources: tuple[Citation, ...] = ()
    # A user's images, in the order given: read with the branch (current_path) and an export,
    # left empty elsewhere (a message just added has those it was given).
    images: tuple[MessageImage, ...] = ()


@dataclass(slots=True, frozen=True)
class SearchHit:
    conversation_id: int
    conversation_title: str | None
    message_id: int
    role: Role
    snippet: str
    created_at: datetime


@dataclass(slots=True, frozen=True)
class AttachedDocument:
    """A document as exported: the user message it came with, and all of it; its id is what
    the replies' citations name (None in an export made before exports kept it)."""

    message_id: int
    document: NewAttachment
    attachment_id: int | None = None


@dataclass(slots=True, frozen=True)
class Thread:
    """A conversation, all its messages, its documents and its images, as exported and
    imported (each image under its message, `Message.images`)."""

    conversation: Conversation
    messages: list[Message]
    documents: list[AttachedDocument] = field(default_factory=list)
