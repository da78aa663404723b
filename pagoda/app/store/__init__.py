"""The conversation store: conversations, message trees, search, settings and tabs in SQLite.

Imports no torch and no Qt. `ConversationStore` is the only code that opens a database session.
"""

from .errors import (
    ConversationNotFound,
    DatabaseInUseError,
    DatabaseLocationError,
    DatabaseTooNewError,
    ImportValidationError,
    MessageNotFound,
    NotAPagodaDatabaseError,
    StoreError,
)
from .location import add_db_argument, default_db_path, resolve_db_path
from .records import (
    Attachment,
    AttachmentChunk,
    ChunkHit,
    Citation,
    Conversation,
    Folder,
    FolderFile,
    GenerationStats,
    Message,
    NewAttachment,
    ReplyParts,
    SamplingSettings,
    SearchHit,
    ToolCall,
)
from .store import ConversationStore
from .streaming import StreamingWriter
from .validation import sampling_setting

__all__ = [
    "Attachment",
    "AttachmentChunk",
    "ChunkHit",
    "Citation",
    "Conversation",
    "ConversationNotFound",
    "ConversationStore",
    "DatabaseInUseError",
    "DatabaseLocationError",
    "DatabaseTooNewError",
    "Folder",
    "FolderFile",
    "GenerationStats",
    "ImportValidationError",
    "Message",
    "MessageNotFound",
    "NewAttachment",
    "NotAPagodaDatabaseError",
    "ReplyParts",
    "SamplingSettings",
    "SearchHit",
    "StoreError",
    "StreamingWriter",
    "ToolCall",
    "add_db_argument",
    "default_db_path",
    "resolve_db_path",
    "sampling_setting",
]
