"""Every store test gets its own database file under tmp_path."""

from collections.abc import Iterator
from pathlib import Path

import pytest

from pagoda.app.store import ConversationStore


@pytest.fixture
def db_path(tmp_path: Path) -> Path:
    return tmp_path / "data" / "pagoda.db"


@pytest.fixture
def store(db_path: Path) -> Iterator[ConversationStore]:
    opened = ConversationStore.open(db_path)
    yield opened
    opened.close()
