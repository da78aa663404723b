"""One process per database: a second opener is refused in words before it reads or changes
anything, so the first one's live reply keeps streaming; the lock dies with its holder."""

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from app.store import ConversationStore, DatabaseInUseError, NotAPagodaDatabaseError

REPO_ROOT = Path(__file__).resolve().parents[2]

# Opens the store, starts a reply and reports; then, per line on stdin, streams one more word
# ("more") or finishes the reply and prints it ("finish").
HOLDER = """
import json, sys
from app.store import ConversationStore

store = ConversationStore.open(sys.argv[1])
cid = store.create_conversation().id
store.append_user_message(cid, "tell me a story")
reply = store.start_assistant_message(cid)
text = "Once "
store.update_streaming(reply.id, text)
print(json.dumps({"id": reply.id}), flush=True)
for line in sys.stdin:
    if line.strip() == "more":
        text += "upon "
        store.update_streaming(reply.id, text)
        print("ok", flush=True)
    else:
        store.finish_message(reply.id, text + "a time.", "stop")
        done = store.get_message(reply.id)
        print(json.dumps({"status": done.status, "content": done.content}), flush=True)
        break
store.close()
"""


@pytest.fixture
def holder(db_path: Path):
    """A real second process that has the database open, mid-reply."""
    child = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(db_path)],
        cwd=REPO_ROOT,
        env={**os.environ, "PYTHONPATH": str(REPO_ROOT)},
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    line = child.stdout.readline()
    assert line, "the holding process died before reporting"
    child.reply_id = json.loads(line)["id"]
    yield child
    if child.poll() is None:
        child.kill()
    child.wait(timeout=10)
    child.stdin.close()
    child.stdout.close()


def _tell(child: subprocess.Popen, command: str) -> str:
    child.stdin.write(command + "\n")
    child.stdin.flush()
    return child.stdout.readline()


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
    assert _tell(holder, "more") == "ok\n"
    finished = json.loads(_tell(holder, "finish"))
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
