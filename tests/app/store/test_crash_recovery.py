"""A process killed mid-stream leaves a reply that the next start marks interrupted."""

import json
import os
import signal
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from pagoda.app.store import ConversationStore

REPO_ROOT = Path(__file__).resolve().parents[3]

STREAMER = """
import json, sys, time
from pagoda.app.store import ConversationStore, StreamingWriter

class Clock:
    now = 0.0
    def __call__(self):
        return self.now

store = ConversationStore.open(sys.argv[1])
cid = store.create_conversation().id
store.append_user_message(cid, "tell me a long story")
reply = store.start_assistant_message(cid)
clock = Clock()
writer = StreamingWriter(store, reply.id, clock=clock)
i = 0
while writer.flush_count < 3:
    clock.now += 0.2
    writer.append(f"word{i} ")
    i += 1
for j in range(3):  # same instant as the last flush: held in memory only
    writer.append(f"unflushed{j} ")
print(json.dumps({"id": reply.id, "flushed": writer.flushed_text, "text": writer.text}), flush=True)
time.sleep(60)
"""


def raw_status(db_path: Path, mid: int) -> str:
    """Read behind the store's back: opening a store would already recover the message."""
    connection = sqlite3.connect(db_path)
    try:
        return connection.execute("SELECT status FROM messages WHERE id = ?", (mid,)).fetchone()[0]
    finally:
        connection.close()


@pytest.mark.skipif(sys.platform == "win32", reason="SIGKILL is POSIX")
def test_killed_stream_is_interrupted_with_text_up_to_the_last_flush(db_path: Path) -> None:
    child = subprocess.Popen(
        [sys.executable, "-c", STREAMER, str(db_path)],
        cwd=REPO_ROOT,
        env={**os.environ, "PYTHONPATH": str(REPO_ROOT)},
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        line = child.stdout.readline()
        assert line, "the streaming process died before reporting"
        report = json.loads(line)
        assert raw_status(db_path, report["id"]) == "streaming"
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait(timeout=10)
        child.stdout.close()
    assert child.returncode == -signal.SIGKILL

    with ConversationStore.open(db_path) as store:
        reply = store.get_message(report["id"])
        assert reply.status == "interrupted"
        assert reply.content == report["flushed"]
        assert reply.content.startswith("word0 ") and "unflushed" in report["text"]
        assert "unflushed" not in reply.content
        assert store.current_path(reply.conversation_id)[-1].id == reply.id
