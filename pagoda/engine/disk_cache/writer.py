"""Writes KV blocks to the disk store on a background thread, so the engine never waits on a disk."""

from __future__ import annotations

import atexit
import logging
import queue
import threading
import time
import weakref
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from pagoda.engine.disk_cache.store import DiskBlockStore

logger = logging.getLogger(__name__)

THREAD_NAME = "pagoda-disk-cache"
# At a normal exit, what is queued gets this long, all writers together, to reach the disk.
EXIT_FLUSH_SECONDS = 5.0

Block = tuple[bytes, tuple[int, ...], bytes]
Tags = Mapping[str, Sequence[bytes]]

_STOP = object()


@dataclass(frozen=True, slots=True)
class _Batch:
    blocks: list[Block]
    tags: Tags = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class DiskWriterStats:
    batches_written: int
    batches_dropped: int
    batches_pending: int


class DiskBlockWriter:
    """A bounded queue of batches and one daemon thread that saves them in order.

    `submit` never blocks: when `max_pending_batches` are already waiting it drops the batch (the
    blocks are simply not cached on disk). `submit` after `close` raises RuntimeError: the engine
    closes its writer last, so a later submit is a bug to see, not data to lose quietly."""

    def __init__(self, store: DiskBlockStore, max_pending_batches: int = 64) -> None:
        if max_pending_batches < 1:
            raise ValueError(f"max_pending_batches={max_pending_batches} must be >= 1")
        self.store = store
        self._queue: queue.Queue = queue.Queue(maxsize=max_pending_batches)
        self._lock = threading.Condition()
        self._submitted = 0
        self._finished = 0  # saved, or discarded by clear()
        self._written = 0
        self._dropped = 0
        self._closed = False
        self._thread = threading.Thread(target=self._run, name=THREAD_NAME, daemon=True)
        self._thread.start()
        _open_writers.add(self)

    def submit(self, blocks: Sequence[Block], tags: Tags | None = None) -> bool:
        """Queue a batch of (hash, token_ids, payload) for saving, with the hashes each cache tag
        used (written first, so no saved block is missing from its tag's list); False if it was
        dropped."""
        with self._lock:
            if self._closed:
                raise RuntimeError("DiskBlockWriter.submit after close(): the writer has stopped")
            try:
                self._queue.put_nowait(_Batch(list(blocks), tags or {}))
            except queue.Full:
                self._dropped += 1
                return False
            self._submitted += 1
            return True

    def flush(self, timeout: float | None = None) -> bool:
        """Wait until every batch submitted so far is saved; False if `timeout` ran out first."""
        with self._lock:
            target = self._submitted
            return self._lock.wait_for(lambda: self._finished >= target, timeout)

    def clear(self) -> None:
        """Drop what is queued, then delete every block on disk ("Clear the cache"): a batch
        still waiting must not bring back what the user asked to remove."""
        with self._lock:
            while True:
                try:
                    batch = self._queue.get_nowait()
                except queue.Empty:
                    break
                if batch is _STOP:
                    self._queue.put_nowait(_STOP)
                    break
                self._finished += 1
            self._lock.notify_all()
        self.store.clear()

    def close(self, timeout: float | None = None) -> bool:
        """Save what is queued, then stop the thread; True if both happened within `timeout`.
        Closing again does nothing more."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._lock:
            already_closed = self._closed
            self._closed = True
        _open_writers.discard(self)
        if not already_closed:
            if not self.flush(_remaining(deadline)):
                return False
            self._queue.put(_STOP)  # cannot block: the queue was just drained
        self._thread.join(_remaining(deadline))
        return not self._thread.is_alive()

    @property
    def stats(self) -> DiskWriterStats:
        with self._lock:
            return DiskWriterStats(
                batches_written=self._written,
                batches_dropped=self._dropped,
                batches_pending=self._submitted - self._finished,
            )

    def _run(self) -> None:
        while True:
            batch = self._queue.get()
            if batch is _STOP:
                return
            try:
                self.store.record_tags(batch.tags)
                self.store.save(batch.blocks)
            except Exception:
                # The store reports its own I/O problems; this is a bug, and the thread must
                # live on or flush() would wait forever.
                logger.exception("Disk KV cache: saving a batch of %d blocks failed",
                                 len(batch.blocks))
            with self._lock:
                self._written += 1
                self._finished += 1
                self._lock.notify_all()


def _remaining(deadline: float | None) -> float | None:
    return None if deadline is None else max(0.0, deadline - time.monotonic())


# Weak, so a writer nobody holds (or one closed) is not kept alive for the exit hook.
_open_writers: weakref.WeakSet[DiskBlockWriter] = weakref.WeakSet()


@atexit.register
def _flush_open_writers() -> None:
    deadline = time.monotonic() + EXIT_FLUSH_SECONDS
    for writer in list(_open_writers):
        if not writer.flush(_remaining(deadline)):
            logger.warning("Disk KV cache: exiting before every queued block was written")
            return
