"""Errors a user of the store can cause, each naming the thing and what to do about it."""

from pathlib import Path


class StoreError(Exception):
    """Base class for every error raised by the conversation store."""


class ConversationNotFound(StoreError):
    def __init__(self, conversation_id: int) -> None:
        super().__init__(f"conversation {conversation_id} does not exist")
        self.conversation_id = conversation_id


class MessageNotFound(StoreError):
    def __init__(self, message_id: int) -> None:
        super().__init__(f"message {message_id} does not exist")
        self.message_id = message_id


class DatabaseTooNewError(StoreError):
    """The database was written by a newer Pagoda; we never downgrade it."""

    def __init__(self, path: Path, revision: str, head: str) -> None:
        super().__init__(
            f"The database {path} has schema revision {revision!r}, written by a newer version of "
            f"Pagoda (this version knows revisions up to {head!r}). It was left untouched: update "
            f"Pagoda, or start it with another database (--db PATH or PAGODA_DB)."
        )
        self.path = path
        self.revision = revision
        self.head = head
