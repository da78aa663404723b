"""Import chats…: a Pagoda export (the JSON that Export… writes) read off the GUI thread and
added through the store's validated import, its refusals in words. No Qt."""

from __future__ import annotations

import asyncio
from concurrent.futures import Executor
from pathlib import Path

from pagoda.app.components.shared.async_store import AsyncStore
from pagoda.app.components.shared.bounded_files import FileTooLargeError, read_utf8
from pagoda.app.store import ImportValidationError
from pagoda.app.store.errors import reason_of

# Far above any real history (a long chat is ~100 KB), well below what parsing costs in memory
# (Python's objects take ~10x the text).
MAX_IMPORT_BYTES = 256 * 2**20
_FIX = "Choose a .json file that Pagoda exported (Export… in a chat's menu)."


class ChatImportError(Exception):
    """A file that cannot be imported as chats: unreadable, too large, not text, not an export."""


def read_export(path: Path, limit: int = MAX_IMPORT_BYTES) -> str:
    """The file's text; refused before more than `limit` bytes are read."""
    try:
        return read_utf8(path, limit)
    except OSError as error:
        raise ChatImportError(f"Pagoda could not read {path}: {reason_of(error)}.") from None
    except FileTooLargeError:
        raise ChatImportError(f"{path} is larger than {limit // 2**20} MiB, more than Pagoda "
                              f"imports at once. {_FIX}") from None
    except UnicodeDecodeError:
        raise ChatImportError(f"{path} is not text (UTF-8), so not a Pagoda export. "
                              f"{_FIX}") from None


async def import_chats(db: AsyncStore, path: Path, executor: Executor) -> list[int]:
    """The ids of the chats imported from `path`; nothing is written if any of it is wrong."""
    text = await asyncio.get_running_loop().run_in_executor(executor, read_export, path,
                                                                 MAX_IMPORT_BYTES)
    try:
        return await db.import_json(text)
    except ImportValidationError as error:
        raise ChatImportError(f"{path.name} is {error}. {_FIX}") from None


def imported_text(path: Path, count: int) -> str:
    """What the status bar says once an import is done."""
    if count == 0:
        return f"{path.name} holds no chats: nothing was imported."
    return f"Imported {count} chat{'' if count == 1 else 's'} from {path.name}."
