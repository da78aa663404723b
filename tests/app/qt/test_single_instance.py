"""One window per database: a second start brings the running window to the front and exits;
when the holder cannot be reached, the user is told in words and the database is not touched."""

import os
import signal
import socket
import sqlite3
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from pagoda.app import bootstrap
from pagoda.app import main as app_main
from pagoda.app.open_store import open_store
from pagoda.app.qt.conversations import database_dialog
from pagoda.app.qt.single_instance import (
    WindowRaiser,
    ask_running_window_to_raise,
    bring_to_front,
    server_name,
)
from pagoda.app.store import DatabaseInUseError
from tests.lock_holder import start_lock_holder

REPO_ROOT = Path(__file__).resolve().parents[3]

ASK = """
import sys
from pathlib import Path
from PySide6.QtCore import QCoreApplication
from pagoda.app.qt.single_instance import ask_running_window_to_raise

app = QCoreApplication([])
print(ask_running_window_to_raise(Path(sys.argv[1])), flush=True)
"""

LISTEN_THEN_WAIT = """
import sys, time
from pathlib import Path
from PySide6.QtCore import QCoreApplication
from pagoda.app.qt.single_instance import WindowRaiser

app = QCoreApplication([])
raiser = WindowRaiser(Path(sys.argv[1]))
print(raiser.listen(), flush=True)
time.sleep(60)
"""


def _env(tmp_path: Path) -> dict[str, str]:
    """Offscreen, and every folder the app keeps things in under this test's tmp_path."""
    return {**os.environ, "PYTHONPATH": str(REPO_ROOT), "QT_QPA_PLATFORM": "offscreen",
            "XDG_DATA_HOME": str(tmp_path / "data"), "XDG_CACHE_HOME": str(tmp_path / "cache"),
            "XDG_CONFIG_HOME": str(tmp_path / "config")}


def _python(tmp_path: Path, script: str, *args: str, **popen) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", script, *args], cwd=REPO_ROOT,
                            env=_env(tmp_path), text=True, **popen)


class _Lines:
    """Collects a process's stream line by line on a thread, so a test can wait for one."""

    def __init__(self, stream) -> None:
        self.lines: list[str] = []
        self._thread = threading.Thread(target=self._read, args=(stream,), daemon=True)
        self._thread.start()

    def _read(self, stream) -> None:
        for line in stream:
            self.lines.append(line)

    def wait_for(self, text: str, timeout_s: float) -> str:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            found = [line for line in self.lines if text in line]
            if found:
                return found[0]
            time.sleep(0.05)
        raise AssertionError(f"no line with {text!r} in {timeout_s} s:\n{''.join(self.lines)}")


def _raw_status(db_path: Path, mid: int) -> str:
    """Read behind the store's back: opening a store would take the lock."""
    connection = sqlite3.connect(db_path)
    try:
        return connection.execute("SELECT status FROM messages WHERE id = ?", (mid,)).fetchone()[0]
    finally:
        connection.close()


class _Asker:
    def __init__(self, *answers) -> None:
        self.answers = list(answers)
        self.errors: list[Exception] = []

    def __call__(self, error):
        self.errors.append(error)
        return self.answers.pop(0)


@pytest.fixture
def holder(tmp_path):
    """A real process with tmp_path/chats.db open mid-reply; yields (process, reply id)."""
    child, reply_id = start_lock_holder(tmp_path / "chats.db", _env(tmp_path))
    yield child, reply_id
    child.stdin.close()
    child.wait(timeout=30)
    child.stdout.close()


@pytest.mark.skipif(sys.platform == "win32", reason="SIGTERM closes the window on POSIX")
def test_a_second_start_brings_the_running_window_to_the_front_and_exits(tmp_path):
    db_path = tmp_path / "chats.db"
    missing_model = str(tmp_path / "missing.gguf")  # the window stays up, without torch's work
    first = subprocess.Popen([sys.executable, "-m", "pagoda", "--db", str(db_path),
                              "--model", missing_model], cwd=REPO_ROOT, env=_env(tmp_path),
                             stderr=subprocess.PIPE, text=True)
    try:
        log = _Lines(first.stderr)
        log.wait_for("window shown", timeout_s=240)
        second = subprocess.run([sys.executable, "-m", "pagoda", "--db", str(db_path)],
                                cwd=REPO_ROOT, env=_env(tmp_path), capture_output=True,
                                text=True, timeout=120, check=False)
        assert second.returncode == 0, second.stderr
        assert (f"pagoda: Pagoda is already open on {db_path}; its window was brought to the "
                f"front.") in second.stderr
        assert "Traceback" not in second.stderr
        log.wait_for("asked for this window: brought to the front", timeout_s=30)
    finally:
        first.send_signal(signal.SIGTERM)  # closes the window as its close button does
        first.wait(timeout=60)
    assert first.returncode == 0, "".join(log.lines)


def test_a_start_that_cannot_reach_the_holder_says_why_and_leaves_the_database_alone(
        holder, qapp, tmp_path, monkeypatch, capsys):
    child, reply_id = holder
    db_path = tmp_path / "chats.db"
    asker = _Asker(None)  # the message box, answered "Quit"
    monkeypatch.setattr(bootstrap, "style_app", lambda app, theme: None)
    monkeypatch.setattr(database_dialog, "ask_for_another_database", asker)

    status = app_main.main(["--db", str(db_path)])

    assert status == app_main.EXIT_NO_DATABASE
    [error] = asker.errors
    assert isinstance(error, DatabaseInUseError)
    assert f"Another Pagoda (process {child.pid}) is using the database {db_path}" in str(error)
    err = capsys.readouterr().err
    assert "pagoda: no conversation database, quitting. Another Pagoda" in err
    assert "Traceback" not in err
    assert _raw_status(db_path, reply_id) == "streaming"  # not marked interrupted


@pytest.mark.usefixtures("holder")
def test_choosing_a_database_another_pagoda_holds_is_refused_in_words(tmp_path):
    taken = tmp_path / "chats.db"
    folder = tmp_path / "a-folder"
    folder.mkdir()
    asker = _Asker(taken, tmp_path / "mine.db")  # "Choose another file…" twice
    store = open_store(folder, asker)  # a folder cannot be a database: the user is asked
    store.close()
    assert store.path == tmp_path / "mine.db"
    assert isinstance(asker.errors[1], DatabaseInUseError)
    assert f"is using the database {taken}" in str(asker.errors[1])


@pytest.fixture
def raiser(qapp, tmp_path):
    made = WindowRaiser(tmp_path / "chats.db")
    yield made
    made.close()


def test_the_running_window_answers_another_process_and_asks_for_the_front(raiser, qtbot,
                                                                          tmp_path):
    assert raiser.listen()
    asked = []
    raiser.raise_requested.connect(lambda: asked.append(True))
    client = _python(tmp_path, ASK, str(tmp_path / "chats.db"), stdout=subprocess.PIPE)
    qtbot.waitUntil(lambda: client.poll() is not None, timeout=60_000)
    assert client.stdout.read() == "True\n"
    client.stdout.close()
    assert asked == [True]


def test_a_closed_window_no_longer_answers(raiser, qtbot, tmp_path):
    assert raiser.listen()
    asked = []
    raiser.raise_requested.connect(lambda: asked.append(True))
    raiser.close()  # as main does once the window has closed
    client = _python(tmp_path, ASK, str(tmp_path / "chats.db"), stdout=subprocess.PIPE)
    qtbot.waitUntil(lambda: client.poll() is not None, timeout=60_000)
    assert client.stdout.read() == "False\n"
    client.stdout.close()
    assert asked == []


def test_a_different_spelling_of_the_database_reaches_the_same_window(tmp_path):
    (tmp_path / "sub").mkdir()
    assert server_name(tmp_path / "sub" / ".." / "chats.db") == server_name(tmp_path / "chats.db")
    assert server_name(tmp_path / "other.db") != server_name(tmp_path / "chats.db")


def test_with_no_pagoda_running_nobody_answers(qapp, tmp_path):
    started = time.monotonic()
    assert not ask_running_window_to_raise(tmp_path / "chats.db")
    assert time.monotonic() - started < 2  # refused at once: no wait for a timeout


@pytest.mark.skipif(sys.platform == "win32", reason="a Unix socket's file")
def test_a_socket_left_by_a_killed_pagoda_does_not_stop_the_next_one(raiser, qtbot, tmp_path):
    crashed = _python(tmp_path, LISTEN_THEN_WAIT, str(tmp_path / "chats.db"),
                      stdout=subprocess.PIPE)
    assert crashed.stdout.readline() == "True\n"
    crashed.kill()
    crashed.wait(timeout=10)
    crashed.stdout.close()

    assert raiser.listen()
    client = _python(tmp_path, ASK, str(tmp_path / "chats.db"), stdout=subprocess.PIPE)
    qtbot.waitUntil(lambda: client.poll() is not None, timeout=60_000)
    assert client.stdout.read() == "True\n"
    client.stdout.close()


@pytest.mark.skipif(sys.platform == "win32", reason="a Unix socket's file")
def test_anything_but_the_one_request_is_cut_off_unanswered(raiser, qtbot):
    assert raiser.listen()
    asked = []
    raiser.raise_requested.connect(lambda: asked.append(True))
    answers: list[bytes] = []

    def send(request: bytes) -> None:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as peer:
            peer.connect(raiser._server.fullServerName())
            peer.sendall(request)
            answers.append(peer.recv(64))

    for request in (b"x" * 1000, b"please raise\n"):
        thread = threading.Thread(target=send, args=(request,), daemon=True)
        thread.start()
        qtbot.waitUntil(lambda t=thread: not t.is_alive(), timeout=10_000)
    assert answers == [b"", b""]
    assert asked == []


def test_bringing_to_front_restores_a_minimized_window(qtbot):
    from PySide6.QtWidgets import QWidget

    window = QWidget()
    qtbot.addWidget(window)
    window.showMinimized()
    bring_to_front(window)
    assert window.isVisible() and not window.isMinimized()
