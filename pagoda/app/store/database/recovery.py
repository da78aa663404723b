"""File-level care of the database: health checks, moving a corrupt file aside, backups.

Only a file that starts like an SQLite database is ever moved aside: anything else at the
database path (a text file given to --db by mistake) is refused and left where it is.
"""

import logging
import sqlite3
from datetime import UTC, datetime
from pathlib import Path

from ..errors import NotAPagodaDatabaseError

log = logging.getLogger(__name__)

CORRUPTION_CODES = {sqlite3.SQLITE_CORRUPT, sqlite3.SQLITE_NOTADB}
SIDE_FILES = ("-wal", "-shm")
SQLITE_HEADER = b"SQLite format 3\x00"


def move_aside_if_damaged(path: Path) -> Path | None:
    """Move a damaged SQLite database aside and return where it went; refuse any other file.

    A missing or empty file is a new database (SQLite itself creates an empty file).
    """
    if not path.exists() or path.stat().st_size == 0:
        return None
    if not starts_like_sqlite(path):
        raise NotAPagodaDatabaseError(path, "it is not an SQLite file")
    return move_aside(path) if is_corrupt(path) else None


def starts_like_sqlite(path: Path) -> bool:
    with path.open("rb") as file:
        return file.read(len(SQLITE_HEADER)) == SQLITE_HEADER


def is_corrupt(path: Path) -> bool:
    """True when SQLite says the file is not a database or fails its quick check.

    Other SQLite errors (the file cannot be opened at all) are raised as they are.
    """
    try:
        connection = sqlite3.connect(path)
        try:
            rows = connection.execute("PRAGMA quick_check").fetchall()
        finally:
            connection.close()
    except sqlite3.DatabaseError as error:
        if getattr(error, "sqlite_errorcode", None) in CORRUPTION_CODES:
            return True
        raise
    return rows != [("ok",)]


def move_aside(path: Path) -> Path:
    """Rename the file (and its WAL/SHM companions) with a timestamp; nothing is deleted."""
    target = _free_name(path, "corrupt")
    for suffix in SIDE_FILES:
        side = path.with_name(path.name + suffix)
        if side.exists():
            side.rename(target.with_name(target.name + suffix))
    path.rename(target)
    log.warning("corrupt database %s moved aside to %s", path, target)
    return target


def write_backup(path: Path, revision: str) -> Path:
    """A consistent copy (SQLite's online backup, WAL content included) next to the database."""
    target = _free_name(path, f"backup-{revision}")
    source = sqlite3.connect(path)
    try:
        copy = sqlite3.connect(target)
        try:
            source.backup(copy)
        finally:
            copy.close()
    finally:
        source.close()
    log.info("database %s backed up to %s before upgrading", path, target)
    return target


def _free_name(path: Path, label: str) -> Path:
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    candidate = path.with_name(f"{path.name}.{label}-{stamp}")
    counter = 1
    while candidate.exists():
        counter += 1
        candidate = path.with_name(f"{path.name}.{label}-{stamp}-{counter}")
    return candidate
