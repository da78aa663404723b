"""A real second Pagoda process holding a database mid-reply, with no window and no socket.

`python -m tests.lock_holder DB` (from the repository root) opens the store, starts a reply ("Once ") and prints
{"id": reply id}; then, per line on stdin, streams one more word ("more", answered "ok") or
finishes the reply and prints it ("finish"). Its stdin closed, it closes the store and exits.
Imports nothing of Qt, so the store's tests stay Qt-free."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]


def start_lock_holder(db_path: Path,
                      env: dict[str, str] | None = None) -> tuple[subprocess.Popen, int]:
    """The holding process (stdin and stdout piped, as text) and its streaming reply's id."""
    child = subprocess.Popen([sys.executable, "-m", "tests.lock_holder", str(db_path)], cwd=REPO_ROOT,
                             env={**(env or os.environ), "PYTHONPATH": str(REPO_ROOT)},
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    line = child.stdout.readline()
    if not line:
        child.kill()
        raise AssertionError("the holding process died before reporting")
    return child, json.loads(line)["id"]


def tell(child: subprocess.Popen, command: str) -> str:
    """Send the holder "more" or "finish"; its answer line."""
    child.stdin.write(command + "\n")
    child.stdin.flush()
    return child.stdout.readline()


def _hold(db_path: str) -> None:
    from pagoda.app.store import ConversationStore

    store = ConversationStore.open(db_path)
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


if __name__ == "__main__":
    _hold(sys.argv[1])
