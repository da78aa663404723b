"""Files read in a child process, within a memory and a time limit: a file is outside input, and
its parsers (PDFium, markitdown's mammoth, openpyxl, lxml) can be made to allocate gigabytes or
spin for minutes by a file of a few kilobytes, or to abort the process they run in. Here that
process is a worker of ours, not the window: past a limit, or crashed, it is killed, the file is
refused in words, and the next file starts a new worker.

The worker is started with `spawn` (a fresh interpreter: the app's process runs Qt and torch
threads, which a fork would copy mid-flight), once, and kept for the files after; starting it
costs ~0.3 s. Its answer comes back through a pipe read with a bound on its length. The memory
limit (RLIMIT_AS above what the worker holds when the file's reading begins) is set on Linux,
where the kernel keeps it; elsewhere only the time limit holds."""

from __future__ import annotations

import importlib
import logging
import multiprocessing
import os
import pickle
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Protocol

from pagoda.app.components.documents.document import MAX_TEXT_CHARS, Document
from pagoda.app.components.documents.errors import (
    DocumentError,
    DocumentTooLargeError,
    ReadingStoppedError,
    UnreadableDocumentError,
)
from pagoda.app.components.documents.reading.convert import convert_document
from pagoda.app.components.documents.reading.pdf import ProgressCallback

logger = logging.getLogger(__name__)

# How often the waiting side looks at the clock and at whether its caller still wants the file.
POLL_S = 0.1
# A Document's text in UTF-8 (at most 4 bytes a character) and its page offsets, pickled.
MAX_REPLY_BYTES = 4 * MAX_TEXT_CHARS + 2**20
START_S = 60.0
_MARKITDOWN = ("markitdown", "markitdown.converters")
_READERS = {".pdf": ("pypdfium2",), ".docx": _MARKITDOWN, ".pptx": _MARKITDOWN,
            ".xlsx": _MARKITDOWN, ".html": _MARKITDOWN, ".htm": _MARKITDOWN,
            ".xhtml": _MARKITDOWN}
_READY = b"ready"
_OUT_OF_MEMORY = 3  # the worker's exit status when Python ran out of the memory it may use
_MAX_REASON_CHARS = 200


@dataclass(frozen=True, slots=True)
class ReadingLimits:
    """What reading one file may take: `memory_bytes` more than the worker held before it
    (a 200-page PDF takes ~50 MiB, a large Word file a few hundred), and `seconds` plus
    `seconds_per_mib` of the file's size (a 200-page PDF takes 0.3 s)."""

    memory_bytes: int = 2 * 2**30
    seconds: float = 30.0
    seconds_per_mib: float = 1.5

    def seconds_for(self, size_bytes: int) -> float:
        return self.seconds + self.seconds_per_mib * size_bytes / 2**20


class ReadingCancelled(Exception):
    """The caller's `stopped()` said to stop; the worker reading the file was killed."""


class DocumentReader(Protocol):
    def __call__(self, path: Path, on_progress: ProgressCallback | None = None,
                 stopped: Callable[[], bool] | None = None) -> Document: ...


class ReadingProcess:
    """Reads files one at a time in its worker process (thread-safe: callers take turns)."""

    def __init__(self, limits: ReadingLimits | None = None) -> None:
        self.limits = limits or ReadingLimits()
        self._lock = threading.Lock()
        self._worker: multiprocessing.process.BaseProcess | None = None
        self._connection: Connection | None = None

    def read(self, path: Path, on_progress: ProgressCallback | None = None,
             stopped: Callable[[], bool] | None = None) -> Document:
        """The file at `path` as a Document, read in the worker; raises a DocumentError in words
        when it cannot be read or went past a limit, OSError when it cannot be opened, and
        ReadingCancelled once `stopped()` (asked every POLL_S) is true. `on_progress(done,
        total)` is called on this thread after each page of a PDF; an exception it raises stops
        the reading and comes out of read."""
        with self._lock:
            connection = self._started()
            connection.send((str(path), self.limits.memory_bytes))
            try:
                return self._answer(path.name, connection, self._time_limit(path), on_progress,
                                    stopped or _never)
            except (DocumentError, OSError, ReadingCancelled):
                raise  # said by the worker, which reads the next file, or it is gone already
            except BaseException:
                self._stop_worker()  # a reading left half done goes with its process
                raise

    def close(self) -> None:
        with self._lock:
            self._stop_worker()

    def _time_limit(self, path: Path) -> float:
        try:
            size = path.stat().st_size
        except OSError:
            size = 0  # the worker says why it cannot be read
        return self.limits.seconds_for(size)

    def _answer(self, name: str, connection: Connection, limit_s: float,
                on_progress: ProgressCallback | None, stopped: Callable[[], bool]) -> Document:
        deadline = time.monotonic() + START_S  # until the worker has its readers imported
        while True:
            if not connection.poll(POLL_S):
                self._check_wanted_in_time(name, deadline, limit_s, stopped)
                continue
            try:
                reply = pickle.loads(connection.recv_bytes(MAX_REPLY_BYTES))
            except EOFError:
                raise self._crashed(name) from None
            except OSError:  # longer than any Document we accept
                self._stop_worker()
                raise DocumentTooLargeError(name, "more text than Pagoda reads",
                                            f"{MAX_TEXT_CHARS:,} characters") from None
            if reply[0] == "started":
                deadline = time.monotonic() + limit_s
            elif reply[0] == "progress":
                if on_progress is not None:
                    on_progress(reply[1], reply[2])
            elif reply[0] == "error":
                raise reply[1]
            else:
                return reply[1]

    def _check_wanted_in_time(self, name: str, deadline: float, limit_s: float,
                              stopped: Callable[[], bool]) -> None:
        if stopped():
            self._stop_worker()
            raise ReadingCancelled(name)
        if time.monotonic() > deadline:
            self._stop_worker()
            shown = f"{limit_s:,.0f} s" if limit_s >= 10 else f"{limit_s:.1f} s"
            raise ReadingStoppedError(name, f"reading it took more than {shown}")

    def _crashed(self, name: str) -> ReadingStoppedError:
        """Why the worker ended in the middle of `name`."""
        status = self._ended_status()
        memory = _amount(self.limits.memory_bytes)
        if status == _OUT_OF_MEMORY:
            return ReadingStoppedError(name, f"reading it needed more than {memory} of memory")
        if status is not None and status < 0:
            what = _signal_name(-status)
            return ReadingStoppedError(name, f"reading it crashed its reader ({what}), as "
                                             f"happens when a file needs more than {memory} "
                                             "of memory")
        return ReadingStoppedError(name, f"its reader ended in the middle of it (exit status "
                                         f"{status})")

    def _started(self) -> Connection:
        if self._worker is not None and self._worker.is_alive() and self._connection is not None:
            return self._connection
        self._stop_worker()
        context = multiprocessing.get_context("spawn")
        ours, theirs = context.Pipe()
        worker = context.Process(target=serve_readings, args=(theirs,), daemon=True,
                                 name="pagoda-reader")
        worker.start()
        theirs.close()
        self._worker, self._connection = worker, ours
        # Its start (an interpreter and our modules, ~0.3 s, seconds on a busy machine) is not
        # the first file's time.
        try:
            if ours.poll(START_S) and ours.recv_bytes(len(_READY)) == _READY:
                return ours
        except (EOFError, OSError):
            pass
        self._stop_worker()
        raise OSError(f"Pagoda's reading process did not start within {START_S:.0f} s")

    def _ended_status(self) -> int | None:
        worker = self._worker
        if worker is not None:
            worker.join(5.0)
        status = worker.exitcode if worker is not None else None
        self._stop_worker()
        return status

    def _stop_worker(self) -> None:
        worker, connection = self._worker, self._connection
        self._worker = self._connection = None
        if connection is not None:
            connection.close()
        if worker is not None:
            if worker.is_alive():
                worker.kill()
            worker.join()
            worker.close()


def serve_readings(connection: Connection) -> None:
    """The worker: reads the files it is sent, one at a time, until its pipe closes."""
    # Ctrl+C in a terminal reaches the whole process group: the app closes its window, and the
    # worker goes when the app does, without a traceback of its own.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    connection.send_bytes(_READY)
    while True:
        try:
            path, memory_bytes = connection.recv()
        except EOFError:
            return
        _import_readers(Path(path))
        _limit_memory(memory_bytes)
        connection.send_bytes(pickle.dumps(("started",)))
        connection.send_bytes(pickle.dumps(_reading(Path(path), connection)))


def _import_readers(path: Path) -> None:
    """The parsers a file of this name is read with, imported before its limits hold: their
    import (markitdown's takes ~1 s and maps ~300 MiB) is the worker's, not the file's."""
    suffix = path.suffix.lower()
    for module in _READERS.get(suffix, ()):
        try:
            importlib.import_module(module)
        except ImportError:
            return  # said in words when the file is read


def _reading(path: Path, connection: Connection) -> tuple:
    def progress(done: int, total: int) -> None:
        connection.send_bytes(pickle.dumps(("progress", done, total)))

    try:
        return "document", convert_document(path, progress)
    except MemoryError:
        os._exit(_OUT_OF_MEMORY)  # what is left of the heap is no state to go on from
    except (DocumentError, OSError) as error:
        return "error", error
    # The parsers raise whatever a damaged file leads them to (RecursionError, struct.error,
    # KeyError, ...): each is this file's failure, said in words.
    except Exception as error:  # noqa: BLE001
        reason = f"{type(error).__name__}: {error}"[:_MAX_REASON_CHARS]
        return "error", UnreadableDocumentError(path.name, f"reading it failed ({reason})")


def _limit_memory(memory_bytes: int) -> None:
    """The worker may map `memory_bytes` more than it has mapped now (Linux only: other
    kernels do not keep RLIMIT_AS)."""
    try:
        import resource

        with open("/proc/self/statm", encoding="ascii") as statm:
            mapped = int(statm.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")
    except (ImportError, OSError):
        return
    _soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    limit = mapped + memory_bytes
    if hard != resource.RLIM_INFINITY:
        limit = min(limit, hard)
    resource.setrlimit(resource.RLIMIT_AS, (limit, hard))


def _never() -> bool:
    return False


def _amount(size: int) -> str:
    if size >= 2**30 and size % 2**30 == 0:
        return f"{size // 2**30} GiB"
    return f"{size / 2**20:,.0f} MiB"


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


_shared = ReadingProcess()


def read_document(path: Path, on_progress: ProgressCallback | None = None,
                  stopped: Callable[[], bool] | None = None) -> Document:
    """The file at `path` as a Document, read in the shared worker process within the default
    ReadingLimits (see ReadingProcess.read). Blocking: call it on the reading thread."""
    return _shared.read(path, on_progress, stopped)
