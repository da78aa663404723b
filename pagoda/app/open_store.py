"""Opening the conversation database at start: while a location is unusable, the user is told
what is wrong and picks another file, or quits."""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path

from pagoda.app.store import ConversationStore
from pagoda.app.store.errors import StoreError

logger = logging.getLogger(__name__)

AskForDatabase = Callable[[StoreError], Path | None]
"""Shown why a database cannot be used; returns another file to try, or None to quit."""


def open_store(path: Path | None, ask: AskForDatabase) -> ConversationStore:
    """Open the database at `path` (None: the default one), then at each file `ask` offers after
    a failure. Raises the last StoreError once `ask` returns None."""
    while True:
        try:
            return ConversationStore.open(path)
        except StoreError as error:
            logger.warning("cannot open the conversation database: %s", error)
            path = ask(error)
            if path is None:
                raise
