"""Alembic, configured in code: the migration scripts ship inside this package."""

import sqlite3
from pathlib import Path

from alembic import command
from alembic.config import Config
from alembic.script import ScriptDirectory
from alembic.util import CommandError

from .connection import create_store_engine
from .errors import StoreError

MIGRATIONS_DIR = Path(__file__).parent / "migrations"


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
    """The stamped revision, read without changing the file (no pragmas, no journal mode)."""
    connection = sqlite3.connect(path)
    try:
        has_table = connection.execute(
            "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'alembic_version'"
        ).fetchone()
        if not has_table:
            _check_empty(connection, path)
            return None
        row = connection.execute("SELECT version_num FROM alembic_version").fetchone()
        return row[0] if row else None
    finally:
        connection.close()


def _check_empty(connection: sqlite3.Connection, path: Path) -> None:
    tables = connection.execute(
        "SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite_%'"
    ).fetchall()
    if tables:
        raise StoreError(
            f"{path} is an SQLite database but not a Pagoda one (it has tables and no schema "
            f"revision); choose another file with --db PATH or PAGODA_DB"
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
