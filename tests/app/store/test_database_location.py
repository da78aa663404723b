"""Unusable database locations: each is one DatabaseLocationError naming the path and the fix."""

import sqlite3
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest

from pagoda.app.store import ConversationStore, DatabaseLocationError, NotAPagodaDatabaseError
from pagoda.app.store.database.migrate import head_revision, upgrade

FIX = "--db PATH or PAGODA_DB"


def refused(path: Path) -> DatabaseLocationError:
    with pytest.raises(DatabaseLocationError) as caught:
        ConversationStore.open(path)
    error = caught.value
    assert error.path == path
    assert str(path) in str(error) and FIX in str(error)
    return error


def tables(path: Path) -> list[str]:
    with sqlite3.connect(path) as raw:
        rows = raw.execute("SELECT name FROM sqlite_master WHERE type = 'table' ORDER BY name")
        names = [name for (name,) in rows]
    raw.close()
    return names


@pytest.fixture
def file_modes_apply(tmp_path: Path) -> Iterator[None]:
    """Skip where file modes do not bind this user (root, CAP_DAC_OVERRIDE); undo chmods after."""
    probe = tmp_path / "mode-probe"
    probe.mkdir(mode=0o500)
    try:
        (probe / "file").touch()
    except PermissionError:
        pass
    else:
        pytest.skip("file modes do not stop this user (root or CAP_DAC_OVERRIDE), so a "
                    "read-only location cannot be made")
    yield
    for path in [tmp_path, *tmp_path.rglob("*")]:
        if path.is_dir() and not path.is_symlink():
            path.chmod(path.stat().st_mode | stat.S_IRWXU)


def make_read_only(path: Path) -> None:
    path.chmod(0o555 if path.is_dir() else 0o444)


@pytest.mark.usefixtures("file_modes_apply")
def test_database_in_a_read_only_folder_is_refused(db_path: Path) -> None:
    ConversationStore.open(db_path).close()
    make_read_only(db_path.parent)
    assert "not writable" in str(refused(db_path))


@pytest.mark.usefixtures("file_modes_apply")
def test_new_database_in_a_read_only_folder_is_refused(db_path: Path) -> None:
    db_path.parent.mkdir()
    make_read_only(db_path.parent)
    assert "not writable" in str(refused(db_path))
    assert not db_path.exists()


@pytest.mark.usefixtures("file_modes_apply")
def test_read_only_database_file_is_refused(db_path: Path) -> None:
    with ConversationStore.open(db_path) as store:
        store.create_conversation("kept")
    make_read_only(db_path)
    assert "read-only" in str(refused(db_path))


@pytest.mark.usefixtures("file_modes_apply")
def test_folder_that_cannot_be_created_for_lack_of_permission_is_refused(tmp_path: Path) -> None:
    locked = tmp_path / "locked"
    locked.mkdir(mode=0o500)
    path = locked / "pagoda" / "pagoda.db"
    assert "cannot be created" in str(refused(path))


@pytest.mark.parametrize("below", ["pagoda.db", "deeper/pagoda.db"])
def test_parent_path_that_is_a_regular_file_is_refused(tmp_path: Path, below: str) -> None:
    blocker = tmp_path / "notes.txt"
    blocker.write_text("my notes")
    error = refused(blocker / below)
    assert f"{blocker} is a file, not a folder" in str(error)
    assert blocker.read_text() == "my notes"


def test_path_that_is_a_folder_is_refused(tmp_path: Path) -> None:
    folder = tmp_path / "pagoda.db"
    folder.mkdir()
    assert "is a folder" in str(refused(folder))


def test_tables_without_a_schema_revision_are_refused_and_left_alone(db_path: Path) -> None:
    db_path.parent.mkdir()
    with sqlite3.connect(db_path) as raw:
        raw.execute("CREATE TABLE alembic_version (version_num VARCHAR(32) NOT NULL)")
        raw.execute("CREATE TABLE conversations (id INTEGER PRIMARY KEY)")
    raw.close()
    error = refused(db_path)
    assert isinstance(error, NotAPagodaDatabaseError) and "left untouched" in str(error)
    assert tables(db_path) == ["alembic_version", "conversations"]


def test_head_revision_with_missing_tables_is_refused(db_path: Path) -> None:
    ConversationStore.open(db_path).close()
    with sqlite3.connect(db_path) as raw:
        raw.execute("DROP TABLE settings")
        raw.execute("DROP TABLE open_tabs")
    raw.close()
    error = refused(db_path)
    assert isinstance(error, NotAPagodaDatabaseError)
    assert "open_tabs, settings" in str(error) and head_revision() in str(error)


def test_half_created_older_revision_that_cannot_be_upgraded_is_refused(db_path: Path) -> None:
    db_path.parent.mkdir()
    upgrade(db_path, "0001")
    with sqlite3.connect(db_path) as raw:
        raw.execute("DROP TABLE conversation_leaves")
        raw.execute("DROP TABLE open_tabs")
        raw.execute("DROP TABLE messages")
    raw.close()
    before = tables(db_path)
    error = refused(db_path)
    assert "0001" in str(error) and "messages" in str(error)
    assert tables(db_path) == before


def test_every_failure_to_open_comes_out_as_a_location_error(
    db_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def disk_gone(*args: object, **kwargs: object) -> None:
        raise sqlite3.OperationalError("disk I/O error")

    monkeypatch.setattr("pagoda.app.store.database.migrate.upgrade", disk_gone)
    assert "disk I/O error" in str(refused(db_path))

