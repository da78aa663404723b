"""The database file: pragmas, migrations, backups, newer databases and corrupt files."""

import hashlib
import sqlite3
from pathlib import Path

import pytest
from sqlalchemy import text

from pagoda.app.store import ConversationStore, DatabaseTooNewError, StoreError
from pagoda.app.store.database.migrate import current_revision, head_revision, upgrade


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_new_database_is_migrated_from_empty_to_head(db_path: Path) -> None:
    with ConversationStore.open(db_path) as store:
        assert store.backup_path is None and store.recovered_from is None
    assert current_revision(db_path) == head_revision()
    assert not any("backup" in p.name for p in db_path.parent.iterdir())


def test_connections_use_wal_foreign_keys_and_a_busy_timeout(store: ConversationStore) -> None:
    expected = {"journal_mode": "wal", "foreign_keys": 1, "busy_timeout": 30000}
    with store._engine.connect() as connection:
        for name, value in expected.items():
            assert connection.execute(text(f"PRAGMA {name}")).scalar() == value


def test_upgrade_from_first_revision_keeps_data_and_backs_up(db_path: Path) -> None:
    db_path.parent.mkdir(parents=True)
    upgrade(db_path, "0001")
    with sqlite3.connect(db_path) as raw:
        raw.execute(
            "INSERT INTO conversations (id, title, created_at, updated_at, sampling, pinned, "
            "archived) VALUES (1, 'Old chat', '2025-01-02 03:04:05.000000', "
            "'2025-01-02 03:04:05.000000', '{}', 0, 0)"
        )
        raw.execute(
            "INSERT INTO messages (id, conversation_id, role, content, created_at, status) "
            "VALUES (1, 1, 'user', 'written before search existed', '2025-01-02 03:04:06', "
            "'complete')"
        )
        raw.execute("INSERT INTO conversation_leaves VALUES (1, 1)")

    with ConversationStore.open(db_path) as store:
        assert current_revision(db_path) == head_revision() != "0001"
        assert [m.content for m in store.current_path(1)] == ["written before search existed"]
        assert store.get_conversation(1).title == "Old chat"
        assert [h.message_id for h in store.search("before search")] == [1]
        backup = store.backup_path
    assert backup is not None and backup.parent == db_path.parent
    assert backup.name.startswith("pagoda.db.backup-0001-")
    assert current_revision(backup) == "0001"
    with sqlite3.connect(backup) as raw:
        assert raw.execute("SELECT title FROM conversations").fetchall() == [("Old chat",)]


def test_opening_an_up_to_date_database_makes_no_backup(db_path: Path) -> None:
    ConversationStore.open(db_path).close()
    with ConversationStore.open(db_path) as store:
        assert store.backup_path is None
    assert sorted(p.name for p in db_path.parent.iterdir() if "backup" in p.name) == []


def test_newer_database_refuses_to_open_and_is_left_untouched(db_path: Path) -> None:
    with ConversationStore.open(db_path) as store:
        store.create_conversation("from the future")
    with sqlite3.connect(db_path) as raw:
        raw.execute("UPDATE alembic_version SET version_num = '0099_from_pagoda_2'")
    raw.close()
    before = digest(db_path)
    files_before = sorted(p.name for p in db_path.parent.iterdir())

    with pytest.raises(DatabaseTooNewError) as error:
        ConversationStore.open(db_path)

    message = str(error.value)
    assert "0099_from_pagoda_2" in message and str(db_path) in message
    assert "newer version of Pagoda" in message and head_revision() in message
    assert digest(db_path) == before
    assert sorted(p.name for p in db_path.parent.iterdir()) == files_before


@pytest.mark.parametrize(
    "content",
    [b"my shopping list\nmilk\n", b"this is not an sqlite database \x00\xff" * 100, b"SQLite"],
)
def test_file_that_is_not_sqlite_is_refused_and_kept_byte_for_byte(
    db_path: Path, content: bytes
) -> None:
    db_path.parent.mkdir(parents=True)
    db_path.write_bytes(content)

    with pytest.raises(StoreError) as error:
        ConversationStore.open(db_path)

    message = str(error.value)
    assert str(db_path) in message and "not a Pagoda database" in message
    assert "left untouched" in message
    assert db_path.read_bytes() == content
    # Only the lock file beside it, which every opener takes before reading the file.
    assert sorted(p.name for p in db_path.parent.iterdir()) == [db_path.name,
                                                                f"{db_path.name}.lock"]


def test_damaged_file_with_the_sqlite_header_is_moved_aside(db_path: Path) -> None:
    db_path.parent.mkdir(parents=True)
    damaged = b"SQLite format 3\x00" + b"\xa5" * 5000
    db_path.write_bytes(damaged)

    with ConversationStore.open(db_path) as store:
        moved = store.recovered_from
        assert moved is not None and moved.parent == db_path.parent
        assert moved.name.startswith("pagoda.db.corrupt-")
        assert moved.read_bytes() == damaged
        c = store.create_conversation("fresh start")
        assert [x.id for x in store.list_conversations()] == [c.id]


def test_empty_file_becomes_a_new_database(db_path: Path) -> None:
    db_path.parent.mkdir(parents=True)
    db_path.touch()
    with ConversationStore.open(db_path) as store:
        assert store.recovered_from is None
        assert store.list_conversations() == []
    assert current_revision(db_path) == head_revision()


def test_database_failing_its_integrity_check_is_moved_aside(db_path: Path) -> None:
    with ConversationStore.open(db_path) as store:
        cid = store.create_conversation().id
        for i in range(200):
            store.append_user_message(cid, f"message number {i} " * 20)
    corrupted = bytearray(db_path.read_bytes())
    page = 4096
    for offset in range(3 * page, len(corrupted) - page, page):
        corrupted[offset + 100 : offset + 400] = b"\xa5" * 300
    db_path.write_bytes(bytes(corrupted))

    with ConversationStore.open(db_path) as store:
        assert store.recovered_from is not None
        assert store.recovered_from.read_bytes() == bytes(corrupted)
        assert store.list_conversations() == []


def test_sqlite_file_of_another_app_is_refused_not_overwritten(db_path: Path) -> None:
    db_path.parent.mkdir(parents=True)
    with sqlite3.connect(db_path) as raw:
        raw.execute("CREATE TABLE photos (id INTEGER PRIMARY KEY)")
    raw.close()
    with pytest.raises(StoreError, match="not a Pagoda database"):
        ConversationStore.open(db_path)
    with sqlite3.connect(db_path) as raw:
        assert raw.execute("SELECT name FROM sqlite_master").fetchall() == [("photos",)]
    raw.close()
