"""Where the database lives (an explicit path, then $PAGODA_DB, then the user data directory)
and whether SQLite can keep a database there."""

import argparse
import os
from pathlib import Path

import platformdirs

from ..errors import DatabaseLocationError

APP_NAME = "pagoda"
DB_FILENAME = "pagoda.db"
ENV_VAR = "PAGODA_DB"


def default_db_path() -> Path:
    return platformdirs.user_data_path(APP_NAME, appauthor=False) / DB_FILENAME


def resolve_db_path(path: Path | str | None = None) -> Path:
    if path is not None:
        return Path(path).expanduser()
    from_env = os.environ.get(ENV_VAR)
    if from_env:
        return Path(from_env).expanduser()
    return default_db_path()


def add_db_argument(parser: argparse.ArgumentParser) -> None:
    """The `--db PATH` flag the app passes on to `ConversationStore.open`."""
    parser.add_argument(
        "--db",
        type=Path,
        default=None,
        metavar="PATH",
        help=f"conversation database (default: ${ENV_VAR} or {default_db_path()})",
    )


def prepare_location(path: Path) -> None:
    """Create the database's folder; refuse a path where SQLite could not read and write it.

    The folder must be writable even for an existing file: SQLite keeps its WAL and
    shared-memory files next to the database.
    """
    if path.is_dir():
        raise DatabaseLocationError(path, "it is a folder, not a file")
    _make_folder(path, path.parent)
    if not os.access(path.parent, os.W_OK | os.X_OK):
        raise DatabaseLocationError(
            path, f"the folder {path.parent} is not writable (SQLite keeps its journal there)"
        )
    if path.exists() and not os.access(path, os.R_OK | os.W_OK):
        raise DatabaseLocationError(path, "the file is read-only")


def _make_folder(path: Path, folder: Path) -> None:
    blocker = _file_in_the_way(folder)
    if blocker is not None:
        raise DatabaseLocationError(path, f"{blocker} is a file, not a folder")
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise DatabaseLocationError(
            path, f"the folder {folder} cannot be created ({error.strerror})"
        ) from error


def _file_in_the_way(folder: Path) -> Path | None:
    """The nearest existing ancestor of `folder` (itself included) when it is not a folder."""
    for candidate in (folder, *folder.parents):
        if candidate.exists():
            return None if candidate.is_dir() else candidate
    return None
