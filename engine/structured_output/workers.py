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
import signal
import threading
from concurrent.futures import ThreadPoolExecutor
from multiprocessing.connection import Connection

import xgrammar as xgr

from engine.errors import EngineDeadError, StructuredOutputError
from engine.structured_output.compiler import NAMES, compile_source, grammar_compiler
from engine.structured_output.vocabulary import Vocabulary

# Compiles at once, each in its own process (a process holds ~0.3 GB: torch comes with xgrammar).
MAX_PROCESSES = 2
# A constraint's compile, from when its process has it: a schema takes milliseconds, a large
# one a second or two on a busy machine.
TIMEOUT_S = 10.0
# A new process imports xgrammar and torch first: seconds on a busy machine, counted apart.
START_TIMEOUT_S = 120.0
# Spawned, not forked: the parent runs torch's threads, which a fork would copy mid-work.
_SPAWN = multiprocessing.get_context("spawn")


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
        self._conn, child = _SPAWN.Pipe()
        self._process = _SPAWN.Process(target=_serve, args=(child, info_json),
                                       name="pagoda-grammar", daemon=True)
        self._process.start()
        child.close()
        self._ready = False

    @property
    def pid(self) -> int | None:
        return self._process.pid

    def is_alive(self) -> bool:
        return self._process.is_alive()

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
        if self._process.is_alive():
            self._process.kill()

    def close(self) -> None:
        self.kill()
        self._process.join()
        self._conn.close()


def _serve(conn: Connection, info_json: str) -> None:
    """The child process: compile each (kind, text) it receives until its pipe closes."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is for the parent, which kills us
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
