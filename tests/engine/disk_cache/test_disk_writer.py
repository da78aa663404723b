"""The background writer: blocks reach the disk off the caller's thread, a busy disk drops
batches instead of making the engine wait, and what is queued is written at a normal exit."""

import gc
import subprocess
import sys
import textwrap
import threading
import time
import weakref
from hashlib import blake2b
from pathlib import Path

import pytest

from pagoda.engine.disk_cache.store import DiskBlockStore
from pagoda.engine.disk_cache.writer import THREAD_NAME, DiskBlockWriter

FINGERPRINT = "ab" * 16
MiB = 1 << 20
REPO = Path(__file__).resolve().parents[3]


def block(n: int) -> tuple[bytes, tuple[int, ...], bytes]:
    tokens = tuple(range(n * 16, n * 16 + 16))
    return blake2b(repr(tokens).encode(), digest_size=16).digest(), tokens, bytes([n % 256]) * 64


def writer_threads() -> int:
    return sum(t.name == THREAD_NAME for t in threading.enumerate())


class SlowStore:
    """Stands in for a disk that hangs: save waits until released."""

    def __init__(self) -> None:
        self.started = threading.Event()
        self.release = threading.Event()
        self.saved: list[list] = []

    def record_tags(self, tags) -> None:
        pass

    def save(self, blocks) -> None:
        self.started.set()
        self.release.wait(10)
        self.saved.append(list(blocks))

    def clear(self) -> None:
        self.saved.clear()


@pytest.fixture
def store(tmp_path) -> DiskBlockStore:
    return DiskBlockStore(tmp_path, FINGERPRINT, MiB)


@pytest.fixture
def writer(store):
    writer = DiskBlockWriter(store)
    yield writer
    writer.close(timeout=5)


def test_submitted_blocks_are_on_disk_after_flush(store, writer):
    assert writer.submit([block(1), block(2)])
    assert writer.submit([block(3)])

    assert writer.flush(timeout=5)

    assert all(store.contains(block(n)[0]) for n in (1, 2, 3))
    assert writer.stats.batches_written == 2
    assert writer.stats.batches_pending == 0


def test_saving_happens_on_the_named_daemon_thread(tmp_path):
    seen = []

    class Recorder(SlowStore):
        def save(self, blocks) -> None:
            seen.append(threading.current_thread())

    writer = DiskBlockWriter(Recorder())
    writer.submit([block(1)])
    writer.flush(timeout=5)
    writer.close(timeout=5)

    assert seen[0] is not threading.current_thread()
    assert seen[0].name == THREAD_NAME and seen[0].daemon


def test_close_writes_what_is_queued_and_stops_the_thread(store):
    others = writer_threads()  # engines of earlier tests may keep theirs
    writer = DiskBlockWriter(store)
    for n in range(10):
        writer.submit([block(n)])

    assert writer.close(timeout=5)

    assert store.stats().num_blocks == 10
    assert writer_threads() == others
    assert writer.close(timeout=5)  # closing again is harmless


def test_full_queue_drops_the_batch_instead_of_waiting():
    slow = SlowStore()
    writer = DiskBlockWriter(slow, max_pending_batches=2)
    writer.submit([block(0)])
    assert slow.started.wait(5)  # the thread holds batch 0; the queue is empty again
    assert writer.submit([block(1)]) and writer.submit([block(2)])

    began = time.monotonic()
    accepted = writer.submit([block(3)])

    assert not accepted
    assert time.monotonic() - began < 0.5
    assert writer.stats.batches_dropped == 1
    assert not writer.flush(timeout=0.05)
    slow.release.set()
    assert writer.close(timeout=5)
    assert [b[0][1] for b in slow.saved] == [block(n)[1] for n in (0, 1, 2)]


def test_submit_after_close_is_refused(writer):
    writer.close(timeout=5)
    with pytest.raises(RuntimeError, match="after close"):
        writer.submit([block(1)])


def test_a_failing_save_does_not_stop_the_writer(store):
    class Broken(SlowStore):
        def save(self, blocks) -> None:
            raise RuntimeError("bug")

    writer = DiskBlockWriter(Broken())
    writer.submit([block(1)])
    writer.submit([block(2)])
    assert writer.flush(timeout=5)
    assert writer.close(timeout=5)


def test_clear_drops_queued_batches_and_deletes_the_blocks(store):
    writer = DiskBlockWriter(store)
    writer.submit([block(1)])
    writer.flush(timeout=5)
    slow_writer = DiskBlockWriter(SlowStore())
    slow_writer.submit([block(2)])
    slow_writer.submit([block(3)])

    writer.clear()
    slow_writer.clear()

    assert store.stats().num_blocks == 0
    assert slow_writer.stats.batches_pending <= 1  # at most the one already being saved
    slow_writer.store.release.set()
    assert slow_writer.close(timeout=5)
    assert writer.close(timeout=5)


def test_a_closed_writer_is_not_kept_alive(store):
    writer = DiskBlockWriter(store)
    writer.close(timeout=5)
    ref = weakref.ref(writer)
    del writer
    gc.collect()
    assert ref() is None


def test_queued_blocks_are_written_when_the_process_exits(tmp_path):
    script = textwrap.dedent(f"""
        import sys, time
        from pathlib import Path
        from pagoda.engine.disk_cache.store import DiskBlockStore
        from pagoda.engine.disk_cache.writer import DiskBlockWriter

        class SlowDisk(DiskBlockStore):
            def save(self, blocks):
                time.sleep(0.2)
                super().save(blocks)

        store = SlowDisk(Path(sys.argv[1]), {FINGERPRINT!r}, 1 << 20)
        writer = DiskBlockWriter(store)
        for n in range(3):
            writer.submit([(bytes([n]) * 16, (n,) * 16, b"kv" * 32)])
        # No close(): the exit hook must write them.
    """)
    subprocess.run([sys.executable, "-c", script, str(tmp_path)], cwd=REPO, check=True, timeout=60)

    reopened = DiskBlockStore(tmp_path, FINGERPRINT, MiB)
    assert [reopened.load(bytes([n]) * 16, (n,) * 16) for n in range(3)] == [b"kv" * 32] * 3
