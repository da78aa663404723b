"""Where the database lives: an explicit path, then $PAGODA_DB, then the user data directory."""

import argparse
import os
from pathlib import Path

import platformdirs

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
