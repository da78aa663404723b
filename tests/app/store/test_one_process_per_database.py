"""One process per database: a second opener is refused in words before it reads or changes
anything, so the first one's live reply keeps streaming; the lock dies with its holder."""

import json
import signal
import sys
from pathlib import Path

import pytest

from pagoda.app.store import ConversationStore, DatabaseInUseError, NotAPagodaDatabaseError
from tests.lock_holder import start_lock_holder, tell


@pytest.fixture
def holder(db_path: Path):
    """A real second process that has the database open, mid-reply."""
    child, reply_id = start_lock_holder(db_path)
    child.reply_id = reply_id
    yield child
    if child.poll() is None:
        child.kill()
    child.wait(timeout=10)
    child.stdin.close()
    child.stdout.close()


def test_a_second_opener_is_refused_naming_the_database_and_the_holder(holder, db_path) -> None:
    with pytest.raises(DatabaseInUseError) as refused:
        ConversationStore.open(db_path)
    message = str(refused.value)
    assert str(db_path) in message
    assert f"Another Pagoda (process {holder.pid}) is using the database" in message
    assert "--db PATH" in message
    assert refused.value.path == db_path and refused.value.holder_pid == holder.pid


def test_the_holders_reply_keeps_being_written_after_a_second_opener_was_refused(
        holder, db_path) -> None:
    with pytest.raises(DatabaseInUseError):
        ConversationStore.open(db_path)
    assert tell(holder, "more") == "ok\n"
    finished = json.loads(tell(holder, "finish"))
    assert finished == {"status": "complete", "content": "Once upon a time."}
    assert holder.wait(timeout=30) == 0
    with ConversationStore.open(db_path) as store:
        reply = store.get_message(holder.reply_id)
        assert (reply.status, reply.content) == ("complete", "Once upon a time.")


@pytest.mark.skipif(sys.platform == "win32", reason="SIGKILL is POSIX")
def test_the_lock_is_released_when_its_holder_is_killed(holder, db_path) -> None:
    holder.send_signal(signal.SIGKILL)
    assert holder.wait(timeout=10) == -signal.SIGKILL
    with ConversationStore.open(db_path) as store:
        # Now the reply really was cut off, and crash recovery says so.
        assert store.get_message(holder.reply_id).status == "interrupted"


def test_the_same_process_cannot_open_a_database_twice(db_path) -> None:
    with ConversationStore.open(db_path), pytest.raises(DatabaseInUseError):
        ConversationStore.open(db_path)


@pytest.mark.skipif(sys.platform == "win32", reason="symbolic links need a privilege there")
def test_a_symbolic_link_to_an_open_database_is_refused_too(db_path, tmp_path) -> None:
    link = tmp_path / "link.db"
    with ConversationStore.open(db_path):
        link.symlink_to(db_path)
        with pytest.raises(DatabaseInUseError) as refused:
            ConversationStore.open(link)
    assert str(link) in str(refused.value)


def test_closing_the_store_releases_the_lock_and_keeps_the_lock_file_beside_it(db_path) -> None:
    ConversationStore.open(db_path).close()
    assert (db_path.parent / "pagoda.db.lock").is_file()
    with ConversationStore.open(db_path) as store:
        assert store.path == db_path


def test_a_database_that_cannot_be_opened_leaves_no_lock_behind(db_path) -> None:
    db_path.parent.mkdir(parents=True)
    db_path.write_text("not a database")
    for _ in range(2):  # the second refusal is the same one, not "in use"
        with pytest.raises(NotAPagodaDatabaseError):
            ConversationStore.open(db_path)
