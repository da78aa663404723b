"""The conversation store: conversations, message trees, search, settings and tabs in SQLite.

Imports no torch and no Qt. `ConversationStore` is the only code that opens a database session.
"""

from .database.location import add_db_argument, default_db_path, resolve_db_path
from .documents.images import MAX_IMAGE_BYTES, ImageRefusedError
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
    MessageImage,
    NewAttachment,
    NewImage,
    ReplyParts,
    SamplingSettings,
    SearchHit,
    ToolCall,
)
from .store import ConversationStore
from .streaming import StreamingWriter
from .transfer.validation import sampling_setting

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
    "ImageRefusedError",
    "ImportValidationError",
    "MAX_IMAGE_BYTES",
    "Message",
    "MessageImage",
    "MessageNotFound",
    "NewAttachment",
    "NewImage",
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
