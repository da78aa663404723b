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


class DatabaseLocationError(StoreError):
    """Pagoda cannot keep its database at this path: a permission, a file in the way, a bad file."""

    def __init__(self, path: Path, problem: str) -> None:
        super().__init__(self.describe(path, problem))
        self.path = path
        self.problem = problem

    @staticmethod
    def describe(path: Path, problem: str) -> str:
        return (
            f"Pagoda cannot use the database {path}: {problem}. Fix that, or choose another "
            f"file with --db PATH or PAGODA_DB."
        )


class DatabaseInUseError(StoreError):
    """Another process holds the database's lock: two writers would mark each other's live
    replies interrupted, so the second is refused before it reads or changes anything."""

    def __init__(self, path: Path, holder_pid: int | None = None) -> None:
        holder = "Another Pagoda" if holder_pid is None else f"Another Pagoda (process {holder_pid})"
        super().__init__(
            f"{holder} is using the database {path}, and one database holds the chats of one "
            f"Pagoda at a time. Switch to that Pagoda's window, or close it first, or start this "
            f"one with another database (--db PATH or PAGODA_DB)."
        )
        self.path = path
        self.holder_pid = holder_pid


class NotAPagodaDatabaseError(DatabaseLocationError):
    """The file holds something else, or a Pagoda schema only half there; it is never changed."""

    @staticmethod
    def describe(path: Path, problem: str) -> str:
        return (
            f"{path} is not a Pagoda database ({problem}). It was left untouched: choose "
            f"another file with --db PATH or PAGODA_DB."
        )


class ImportValidationError(StoreError):
    """An export document with a wrong field; `where` is its path, e.g. conversations[2].id."""

    def __init__(self, where: str, problem: str) -> None:
        super().__init__(f"not a valid Pagoda export: {where} {problem}")
        self.where = where
        self.problem = problem


def reason_of(error: BaseException) -> str:
    """The short reason inside an OS, SQLite or SQLAlchemy error (without SQL or links)."""
    cause = getattr(error, "orig", None) or error
    if isinstance(cause, OSError) and cause.strerror:
        return f"{cause.strerror}: {cause.filename}" if cause.filename else cause.strerror
    return str(cause)
