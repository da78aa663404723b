"""Reading block files before the engine asks for them (issue 31).

A prompt is added a step or more before it is scheduled. When its next blocks are on disk and
not in the memory cache, `ReadAhead.prefetch` has background threads read them through the store
(which verifies each file) into a window of payloads in host memory. When the scheduler loads
the blocks, `ReadAhead.load` takes each from the window, waits for it while a thread reads it,
or reads it itself when no thread has started on it: the engine thread pays only what it waits.

The window holds at most `max_bytes` of payloads, read or being read. A thread waits for room
rather than push out a payload of its own prompt not yet taken; it pushes out, the oldest first,
those another prompt left (the engine discards what a prompt did not take once it is scheduled
or ends, so these are few). Payloads the store refused are kept as misses, as the store would
answer them.
"""

from __future__ import annotations

import os
import threading
from collections import OrderedDict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from pagoda.engine.disk_cache.store import DiskBlockStore

THREAD_NAME = "pagoda-disk-read"
DEFAULT_MAX_BYTES = 64 << 20
# Blocks waiting to be read, every prompt's together: 65,536 tokens of 16-token blocks.
MAX_QUEUED = 4096
# Reading a block and checking its CRC is bound by memory bandwidth, which a few threads fill;
# a small machine gets one, so that its cores stay with the model.
NUM_THREADS = min(4, max(1, (os.cpu_count() or 1) // 4))

Block = tuple[bytes, tuple[int, ...]]


@dataclass(slots=True, eq=False)
class _Entry:
    token_ids: tuple[int, ...]
    prompt: int  # which `prefetch` call asked for it first
    payload: bytes | None = None


@dataclass(frozen=True, slots=True)
class ReadAheadStats:
    """read: blocks read ahead (misses included); taken: of those, loads they served; dropped:
    read ahead, then pushed out or discarded unused."""

    read: int
    taken: int
    dropped: int


class ReadAhead:
    """Thread-safe: `prefetch`, `load` and `discard` run on the engine thread, `clear` on any,
    the reads on `num_threads` daemon threads started by the first `prefetch`."""

    def __init__(self, store: DiskBlockStore, block_bytes: int,
                 max_bytes: int = DEFAULT_MAX_BYTES, num_threads: int = NUM_THREADS) -> None:
        """block_bytes: every payload's size; one of another size is kept as a miss. The window
        holds at least one block, however small `max_bytes`."""
        if block_bytes < 1 or num_threads < 1:
            raise ValueError(f"block_bytes={block_bytes} and num_threads={num_threads} must be "
                             ">= 1")
        self.store = store
        self.block_bytes = block_bytes
        self.max_blocks = max(1, max_bytes // block_bytes)
        self.num_threads = num_threads
        self._lock = threading.Condition()
        self._queued: OrderedDict[bytes, _Entry] = OrderedDict()
        self._reading: dict[bytes, _Entry] = {}
        self._ready: OrderedDict[bytes, _Entry] = OrderedDict()
        # Reads under way, those whose entry was discarded meanwhile included: they hold memory.
        self._num_reads = 0
        self._num_prompts = 0
        self._threads: list[threading.Thread] = []
        self._closed = False
        self._read = self._taken = self._dropped = 0

    def prefetch(self, blocks: Sequence[Block]) -> None:
        """Have these blocks (hash, token ids) read, in this order, unless they already are.
        After `close`, nothing is read ahead (`load` still reads)."""
        with self._lock:
            if self._closed or not blocks:
                return
            self._num_prompts += 1
            for block_hash, token_ids in blocks:
                if len(self._queued) >= MAX_QUEUED:
                    break
                if self._entry(block_hash) is None:
                    self._queued[block_hash] = _Entry(token_ids, self._num_prompts)
            self._start_threads()
            self._lock.notify_all()

    def load(self, block_hash: bytes, token_ids: tuple[int, ...]) -> bytes | None:
        """The block's payload, or None, as the store's `load` answers: taken from the window,
        waited for while a thread reads it, or read now."""
        with self._lock:
            self._queued.pop(block_hash, None)  # no thread started on it: read it here
            while (reading := self._reading.get(block_hash)) and reading.token_ids == token_ids:
                self._lock.wait()
            entry = self._ready.get(block_hash)
            if entry is not None and entry.token_ids == token_ids:
                del self._ready[block_hash]
                self._taken += 1
                self._lock.notify_all()
                return entry.payload
        return self.store.load(block_hash, token_ids)

    def discard(self, block_hashes: Iterable[bytes]) -> None:
        """Forget what was read ahead for these blocks (and stop reading them): nobody will take
        it."""
        with self._lock:
            if not (self._queued or self._reading or self._ready):
                return
            for block_hash in block_hashes:
                self._queued.pop(block_hash, None)
                self._reading.pop(block_hash, None)
                if self._ready.pop(block_hash, None) is not None:
                    self._dropped += 1
            self._lock.notify_all()

    def clear(self) -> None:
        """Forget everything read ahead (the blocks on disk were removed); reads under way are
        dropped when they end."""
        with self._lock:
            self._dropped += len(self._ready)
            self._queued.clear()
            self._reading.clear()
            self._ready.clear()
            self._lock.notify_all()

    def close(self, timeout: float | None = None) -> None:
        """Stop the threads (a read under way ends first) and forget what was read."""
        with self._lock:
            self._closed = True
        self.clear()
        for thread in self._threads:
            thread.join(timeout)

    def stats(self) -> ReadAheadStats:
        with self._lock:
            return ReadAheadStats(self._read, self._taken, self._dropped)

    @property
    def held_bytes(self) -> int:
        """Host memory the window holds now: payloads read and reads under way."""
        with self._lock:
            return (len(self._ready) + self._num_reads) * self.block_bytes

    def _entry(self, block_hash: bytes) -> _Entry | None:
        return (self._queued.get(block_hash) or self._reading.get(block_hash)
                or self._ready.get(block_hash))

    def _start_threads(self) -> None:
        while len(self._threads) < self.num_threads:
            thread = threading.Thread(target=self._run, name=THREAD_NAME, daemon=True)
            thread.start()
            self._threads.append(thread)

    def _run(self) -> None:
        while (picked := self._next_read()) is not None:
            block_hash, entry = picked
            payload = self.store.load(block_hash, entry.token_ids)
            if payload is not None and len(payload) != self.block_bytes:
                payload = None  # the tier refuses it, as it would from the store
            with self._lock:
                self._num_reads -= 1
                self._read += 1
                if self._reading.get(block_hash) is entry:
                    del self._reading[block_hash]
                    entry.payload = payload
                    self._ready[block_hash] = entry
                else:
                    self._dropped += 1  # discarded or cleared while it was read
                self._lock.notify_all()

    def _next_read(self) -> tuple[bytes, _Entry] | None:
        """The next block to read, once the window has room for it; None once closed."""
        with self._lock:
            while not self._closed:
                if self._queued:
                    block_hash, entry = next(iter(self._queued.items()))
                    if self._make_room(entry.prompt):
                        del self._queued[block_hash]
                        self._reading[block_hash] = entry
                        self._num_reads += 1
                        return block_hash, entry
                self._lock.wait()
            return None

    def _make_room(self, prompt: int) -> bool:
        """Whether one more block fits, once payloads other prompts left are pushed out."""
        while len(self._ready) + self._num_reads >= self.max_blocks:
            other = next((h for h, e in self._ready.items() if e.prompt != prompt), None)
            if other is None:
                return False
            del self._ready[other]
            self._dropped += 1
        return True
