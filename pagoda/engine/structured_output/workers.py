"""Grammars compiled in child processes, each within a deadline.

xgrammar compiles in C++, which Python cannot interrupt, and a short pattern can take minutes:
ten `[^a]{1,1000}` in a row took 60 s of one core (the token masks are worked out for every
position of every repetition). In a child process such a compile can be stopped: at its
deadline, or as soon as its caller stops waiting (the client left, the server is stopping), the
process is killed, and the next compile starts a fresh one. MAX_PROCESSES compile at once, so
one slow constraint does not hold up another request's; one process is kept between compiles.
A grammar comes back serialized (tens of KB for a schema) and the engine's cache keeps it.
"""

from __future__ import annotations

import asyncio
import multiprocessing
import os
import signal
import socket
import subprocess
import sys
import threading
from concurrent.futures import ThreadPoolExecutor
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Protocol

import xgrammar as xgr

from pagoda.engine.errors import EngineDeadError, StructuredOutputError
from pagoda.engine.structured_output.compiler import NAMES, compile_source, grammar_compiler
from pagoda.engine.structured_output.vocabulary import Vocabulary

# Compiles at once, each in its own process (a process holds ~0.3 GB: torch comes with xgrammar).
MAX_PROCESSES = 2
# A constraint's compile, from when its process has it: a schema takes milliseconds, a large
# one a second or two on a busy machine.
TIMEOUT_S = 10.0
# A new process imports xgrammar and torch first: seconds on a busy machine, counted apart.
START_TIMEOUT_S = 120.0
# Never forked: the parent runs torch's threads, which a fork would copy mid-work. Started as a
# fresh interpreter that imports only this module (multiprocessing's spawn would run the
# parent's __main__ again, a user's script without a main guard included); a frozen app, or
# Windows, which cannot pass a socket to a child, uses spawn, where freeze_support answers.
_SPAWN = multiprocessing.get_context("spawn")
# Where `pagoda` is imported from, for the child's sys.path.
_SOURCE_ROOT = str(Path(__file__).resolve().parents[3])


class CompileCancelled(Exception):
    """The caller stopped waiting for a compile (its process was killed)."""


class _PastDeadline(Exception):
    """A compile ran longer than its deadline."""


class GrammarWorkers:
    """Compiles constraints in up to `processes` child processes, each compile stopped after
    `timeout_s` (StructuredOutputError saying so) or when the task awaiting it is cancelled."""

    def __init__(self, vocabulary: Vocabulary, processes: int = MAX_PROCESSES,
                 timeout_s: float = TIMEOUT_S) -> None:
        self.timeout_s = timeout_s
        self._vocabulary = vocabulary
        self._info_json: str | None = None
        self._threads = ThreadPoolExecutor(processes, thread_name_prefix="pagoda-grammar")
        self._idle: list[_Process] = []
        self._started: set[_Process] = set()
        self._lock = threading.Lock()
        self._closed = False

    async def compile(self, kind: str, text: str) -> xgr.CompiledGrammar:
        """`compile_source`'s grammar, made in a child process; StructuredOutputError naming
        what is wrong, or that it ran past the deadline; EngineDeadError after `close`."""
        job = _Job(kind, text)
        try:
            return await asyncio.get_running_loop().run_in_executor(self._threads, self._run, job)
        except asyncio.CancelledError:
            job.cancel()
            raise
        except RuntimeError as exc:
            if "shutdown" not in str(exc):
                raise
            raise EngineDeadError("the engine was shut down") from exc

    def close(self) -> None:
        """Kill every process, compiling or not: nothing waits for a compile to end."""
        with self._lock:
            self._closed = True
            busy = self._started.difference(self._idle)
            idle, self._started, self._idle = self._idle, set(), []
        for process in busy:
            process.kill()  # its thread sees the pipe close, and reaps it
        for process in idle:
            process.close()
        self._threads.shutdown(wait=False, cancel_futures=True)

    def process_ids(self) -> list[int]:
        """The child processes alive now (tests watch a cancelled compile's process end)."""
        with self._lock:
            return [p.pid for p in self._started if p.is_alive()]

    def _run(self, job: _Job) -> xgr.CompiledGrammar:
        """On a pool thread: the job's compile in an idle process, or a new one."""
        process = self._take()
        if not job.attach(process):
            self._give_back(process)
            raise CompileCancelled
        try:
            reply = process.compile(job.kind, job.text, self.timeout_s)
        except _PastDeadline:
            self._drop(process)
            raise StructuredOutputError(_too_slow(job.kind, self.timeout_s)) from None
        except (EOFError, OSError) as exc:
            self._drop(process)
            if job.cancelled:
                raise CompileCancelled from exc
            if self._closed:
                raise EngineDeadError("the engine was shut down") from exc
            raise StructuredOutputError(f"the {NAMES[job.kind]} could not be compiled: the "
                                        "compiling process ended") from exc
        self._give_back(process)
        status, value = reply
        if status == "error":
            raise StructuredOutputError(value)
        return xgr.CompiledGrammar.deserialize_json(value, self._vocabulary.info)

    def _take(self) -> _Process:
        with self._lock:
            if self._closed:
                raise EngineDeadError("the engine was shut down")
            if self._idle:
                return self._idle.pop()
            if self._info_json is None:
                self._info_json = self._vocabulary.info.serialize_json()
            process = _Process(self._info_json)
            self._started.add(process)
            return process

    def _give_back(self, process: _Process) -> None:
        """Keep one idle process for the next compile; end the others (each holds ~0.3 GB)."""
        with self._lock:
            kept = process in self._started and not self._idle
            if kept:
                self._idle.append(process)
            else:
                self._started.discard(process)
        if not kept:
            process.close()

    def _drop(self, process: _Process) -> None:
        with self._lock:
            self._started.discard(process)
        process.close()


def _too_slow(kind: str, timeout_s: float) -> str:
    return (f"the {NAMES[kind]} did not compile within {timeout_s:g} s: it makes too large a "
            "grammar over this model's vocabulary (bounded repetitions such as "
            "[^a]{1,1000}, or a maxLength or maxItems in the thousands, multiply its states); "
            "use fewer or smaller counts, or * and + in their place")


class _Job:
    """One compile, and the process doing it, which `cancel` kills."""

    def __init__(self, kind: str, text: str) -> None:
        self.kind = kind
        self.text = text
        self.cancelled = False
        self._process: _Process | None = None
        self._lock = threading.Lock()

    def attach(self, process: _Process) -> bool:
        """Whether the job still runs (it was not cancelled), now in `process`."""
        with self._lock:
            self._process = process
            return not self.cancelled

    def cancel(self) -> None:
        with self._lock:
            self.cancelled = True
            if self._process is not None:
                self._process.kill()


class _Process:
    """A child process that compiles what it is sent, one constraint at a time."""

    def __init__(self, info_json: str) -> None:
        if _uses_spawn():
            self._child: _Child = _SpawnedChild()
        else:
            self._child = _InterpreterChild()
        self._conn = self._child.conn
        self._conn.send(info_json)
        self._ready = False

    @property
    def pid(self) -> int | None:
        return self._child.pid

    def is_alive(self) -> bool:
        return self._child.is_alive()

    def compile(self, kind: str, text: str, timeout_s: float) -> tuple[str, str]:
        """("ok", the grammar serialized) or ("error", why); _PastDeadline past `timeout_s`,
        EOFError or OSError when the process was killed (or did not start)."""
        if not self._ready:
            if not self._conn.poll(START_TIMEOUT_S):
                raise EOFError("the compiling process did not start")
            self._conn.recv()
            self._ready = True
        self._conn.send((kind, text))
        if not self._conn.poll(timeout_s):
            raise _PastDeadline
        return self._conn.recv()

    def kill(self) -> None:
        """Any thread: ends the process now; whoever waits on it gets EOFError."""
        if self._child.is_alive():
            self._child.kill()

    def close(self) -> None:
        self.kill()
        self._child.join()
        self._conn.close()


def _uses_spawn() -> bool:
    return bool(getattr(sys, "frozen", False)) or sys.platform == "win32"


class _Child(Protocol):
    conn: Connection
    pid: int | None

    def is_alive(self) -> bool: ...
    def kill(self) -> None: ...
    def join(self) -> None: ...


class _InterpreterChild:
    """`python -c` importing this module, its end of a socket pair passed by descriptor; in a
    session of its own, so a terminal's Ctrl-C goes to the parent, which kills it."""

    def __init__(self) -> None:
        mine, theirs = socket.socketpair()
        with theirs:
            fd = theirs.fileno()
            path = os.pathsep.join(filter(None, [_SOURCE_ROOT, os.environ.get("PYTHONPATH")]))
            self._popen = subprocess.Popen(
                [sys.executable, "-c", f"from {__name__} import serve_fd; serve_fd({fd})"],
                pass_fds=(fd,), stdin=subprocess.DEVNULL, start_new_session=True,
                env={**os.environ, "PYTHONPATH": path})
        self.conn = Connection(mine.detach())
        self.pid = self._popen.pid

    def is_alive(self) -> bool:
        return self._popen.poll() is None

    def kill(self) -> None:
        self._popen.kill()

    def join(self) -> None:
        self._popen.wait()


class _SpawnedChild:
    def __init__(self) -> None:
        self.conn, child = _SPAWN.Pipe()
        self._process = _SPAWN.Process(target=_serve, args=(child,), name="pagoda-grammar",
                                       daemon=True)
        self._process.start()
        child.close()
        self.pid = self._process.pid

    def is_alive(self) -> bool:
        return self._process.is_alive()

    def kill(self) -> None:
        self._process.kill()

    def join(self) -> None:
        self._process.join()


def serve_fd(fd: int) -> None:
    """The child interpreter's entry: serve on the socket `fd` its parent passed."""
    _serve(Connection(fd))


def _serve(conn: Connection) -> None:
    """The child process: take the vocabulary, then compile each (kind, text) it receives
    until its pipe closes."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is for the parent, which kills us
    try:
        info_json = conn.recv()
    except (EOFError, OSError):
        return
    compiler = grammar_compiler(xgr.TokenizerInfo.deserialize_json(info_json))
    conn.send(("ready", ""))
    while True:
        try:
            kind, text = conn.recv()
        except (EOFError, OSError):
            return
        try:
            reply = ("ok", compile_source(compiler, kind, text).serialize_json())
        except StructuredOutputError as exc:
            reply = ("error", str(exc))
        conn.send(reply)
