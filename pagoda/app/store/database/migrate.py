"""Alembic, configured in code: the migration scripts ship inside this package."""

import sqlite3
from pathlib import Path

from alembic import command
from alembic.config import Config
from alembic.script import ScriptDirectory
from alembic.util import CommandError
from sqlalchemy.exc import SQLAlchemyError

from ..errors import DatabaseLocationError, DatabaseTooNewError, NotAPagodaDatabaseError, reason_of
from ..schema import Base
from . import recovery
from .connection import create_store_engine

MIGRATIONS_DIR = Path(__file__).parent / "migrations"
VERSION_TABLE = "alembic_version"
# Made by revisions 0002 and 0004 with raw SQL, so not in the ORM metadata.
FTS_TABLES = ("messages_fts", "attachment_chunks_fts", "attachment_chunks_cjk")


def migrate_to_head(path: Path) -> Path | None:
    """Create or upgrade the database; returns the backup written before an upgrade, if any."""
    revision = current_revision(path) if path.exists() else None
    head = head_revision()
    backup = None if revision == head else _upgrade(path, revision, head)
    check_tables(path, head)
    return backup


def _upgrade(path: Path, revision: str | None, head: str) -> Path | None:
    if revision is not None and not is_known_revision(revision):
        raise DatabaseTooNewError(path, revision, head)
    backup = recovery.write_backup(path, revision) if revision is not None else None
    try:
        upgrade(path)
    except (sqlite3.Error, SQLAlchemyError) as error:
        raise DatabaseLocationError(path, _failed_upgrade(revision, backup, error)) from error
    return backup


def _failed_upgrade(revision: str | None, backup: Path | None, error: Exception) -> str:
    if revision is None:
        return f"creating its tables failed ({reason_of(error)})"
    return (
        f"upgrading it from schema revision {revision} failed ({reason_of(error)}); the "
        f"upgrade was rolled back and a copy from before it is at {backup}"
    )


def check_tables(path: Path, revision: str) -> None:
    """Refuse a database stamped with `revision` that lacks some of its tables (half-created)."""
    missing = sorted(_expected_tables() - _tables(path))
    if missing:
        raise NotAPagodaDatabaseError(
            path,
            f"it is stamped with Pagoda schema revision {revision} but the tables "
            f"{', '.join(missing)} are missing: it is damaged or was only half created",
        )


def _expected_tables() -> set[str]:
    return {*Base.metadata.tables, VERSION_TABLE, *FTS_TABLES}


def _tables(path: Path) -> set[str]:
    connection = sqlite3.connect(path)
    try:
        rows = connection.execute("SELECT name FROM sqlite_master WHERE type = 'table'")
        return {name for (name,) in rows}
    finally:
        connection.close()


def alembic_config() -> Config:
    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS_DIR))
    return config


def head_revision() -> str:
    head = ScriptDirectory.from_config(alembic_config()).get_current_head()
    assert head is not None, "the store ships at least one migration"
    return head


def is_known_revision(revision: str) -> bool:
    try:
        return ScriptDirectory.from_config(alembic_config()).get_revision(revision) is not None
    except CommandError:
        return False


def current_revision(path: Path) -> str | None:
    """The stamped revision, read without changing the file (no pragmas, no journal mode).

    None for a database with no tables; a database with tables but no revision is refused.
    """
    connection = sqlite3.connect(path)
    try:
        row = None
        if _has_version_table(connection):
            row = connection.execute(f"SELECT version_num FROM {VERSION_TABLE}").fetchone()
        if row is None:
            _check_empty(connection, path)
            return None
        return row[0]
    finally:
        connection.close()


def _has_version_table(connection: sqlite3.Connection) -> bool:
    query = "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?"
    return connection.execute(query, (VERSION_TABLE,)).fetchone() is not None


def _check_empty(connection: sqlite3.Connection, path: Path) -> None:
    tables = connection.execute(
        "SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite_%' "
        "AND name != ?",
        (VERSION_TABLE,),
    ).fetchall()
    if tables:
        raise NotAPagodaDatabaseError(
            path,
            "it is an SQLite database with tables but no Pagoda schema revision: another "
            "program's database, or one whose creation was cut short",
        )


def upgrade(path: Path, revision: str = "head") -> None:
    # Foreign keys off while migrating: a table rebuilt by a batch migration would otherwise
    # cascade-delete the rows that point at it.
    engine = create_store_engine(path, foreign_keys=False, pooled=False)
    try:
        with engine.begin() as connection:
            config = alembic_config()
            config.attributes["connection"] = connection
            command.upgrade(config, revision)
    finally:
        engine.dispose()
