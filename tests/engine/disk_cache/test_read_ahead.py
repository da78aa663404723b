"""Reading block files ahead: a block read ahead is loaded without reading its file again, a
damaged file found ahead is a miss, the window of payloads stays within its bound, and the cost
model sees what reading ahead saves."""

from __future__ import annotations

import threading
import time
from collections import Counter
from hashlib import blake2b

import pytest
import torch

from pagoda.engine.disk_cache.block_io import KVBlockIO
from pagoda.engine.disk_cache.read_ahead import THREAD_NAME, ReadAhead
from pagoda.engine.disk_cache.store import DiskBlockStore
from pagoda.engine.disk_cache.tier import BlockRef, DiskPrefixCache

FINGERPRINT = "ab" * 16
PAYLOAD = 256
MiB = 1 << 20


def tokens_of(n: int) -> tuple[int, ...]:
    return tuple(range(n * 16, n * 16 + 16))


def hash_of(n: int) -> bytes:
    return blake2b(repr(tokens_of(n)).encode(), digest_size=16).digest()


def payload_of(n: int) -> bytes:
    return bytes((n + i) % 251 for i in range(PAYLOAD))


def ahead(*ns: int) -> list[tuple[bytes, tuple[int, ...]]]:
    return [(hash_of(n), tokens_of(n)) for n in ns]


class CountingStore:
    """The real store, counting the files each block's loads read; a block in `hold` is read
    only once `release` is set, and every read takes at least `delay` seconds (a slow disk)."""

    def __init__(self, store: DiskBlockStore, delay: float = 0.0) -> None:
        self.store = store
        self.delay = delay
        self.read_ahead: ReadAhead | None = None  # whose window to note at each read
        self.loads: Counter[bytes] = Counter()
        self.held_at_reads: list[int] = []
        self.hold: set[bytes] = set()
        self.reading = threading.Event()
        self.release = threading.Event()

    def load(self, block_hash: bytes, token_ids: tuple[int, ...]) -> bytes | None:
        self.loads[block_hash] += 1
        if self.read_ahead is not None:
            self.held_at_reads.append(self.read_ahead.held_bytes)
        if block_hash in self.hold:
            self.reading.set()
            self.release.wait(10)
        time.sleep(self.delay)
        return self.store.load(block_hash, token_ids)


@pytest.fixture
def store(tmp_path) -> DiskBlockStore:
    store = DiskBlockStore(tmp_path, FINGERPRINT, MiB)
    store.save([(hash_of(n), tokens_of(n), payload_of(n)) for n in range(12)])
    return store


@pytest.fixture
def reader(store):
    """make(max_blocks, num_threads) -> a ReadAhead of `store` through a CountingStore, and
    that; closed after the test."""
    made: list[ReadAhead] = []

    def make(max_blocks: int = 64, num_threads: int = 2) -> tuple[ReadAhead, CountingStore]:
        counting = CountingStore(store)
        read_ahead = ReadAhead(counting, PAYLOAD, max_bytes=max_blocks * PAYLOAD,
                               num_threads=num_threads)
        counting.read_ahead = read_ahead
        made.append(read_ahead)
        return read_ahead, counting

    yield make
    for read_ahead in made:
        read_ahead.close(timeout=10)


def wait_until(condition, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.005)


def test_a_block_read_ahead_is_loaded_without_reading_its_file_again(store, reader):
    read_ahead, counting = reader()
    read_ahead.prefetch(ahead(0, 1, 2))
    wait_until(lambda: read_ahead.stats().read == 3)

    loaded = [read_ahead.load(h, t) for h, t in ahead(0, 1, 2)]

    assert loaded == [payload_of(0), payload_of(1), payload_of(2)]
    assert set(counting.loads.values()) == {1}
    assert store.stats().hits == 3
    assert read_ahead.stats().taken == 3 and read_ahead.held_bytes == 0


def test_a_block_not_read_ahead_is_read_from_its_file(reader):
    read_ahead, counting = reader()

    assert read_ahead.load(hash_of(4), tokens_of(4)) == payload_of(4)
    assert counting.loads[hash_of(4)] == 1


def test_a_load_waits_for_the_read_under_way_rather_than_read_again(reader):
    read_ahead, counting = reader(num_threads=1)
    counting.hold.add(hash_of(0))
    read_ahead.prefetch(ahead(0))
    assert counting.reading.wait(10)
    got = []
    engine = threading.Thread(target=lambda: got.append(read_ahead.load(*ahead(0)[0])))
    engine.start()
    time.sleep(0.05)

    assert got == []  # still waiting for the thread's read
    counting.release.set()
    engine.join(10)
    assert got == [payload_of(0)]
    assert counting.loads[hash_of(0)] == 1


def file_of(store: DiskBlockStore, n: int):
    name = hash_of(n).hex()
    return store.folder / store.fingerprint / name[:2] / f"{name}.kv"


def test_a_corrupt_file_found_while_reading_ahead_is_a_miss_and_is_removed(store, reader):
    path = file_of(store, 1)
    data = bytearray(path.read_bytes())
    data[-5] ^= 0xFF
    path.write_bytes(bytes(data))
    read_ahead, counting = reader()
    read_ahead.prefetch(ahead(0, 1))
    wait_until(lambda: read_ahead.stats().read == 2)

    assert read_ahead.load(*ahead(0)[0]) == payload_of(0)
    assert read_ahead.load(*ahead(1)[0]) is None
    assert not path.exists() and not store.contains(hash_of(1))
    assert store.stats().errors == 1
    assert counting.loads[hash_of(1)] == 1  # the miss was not read again


def test_the_window_never_holds_more_than_its_bound(reader):
    read_ahead, counting = reader(max_blocks=3)
    read_ahead.prefetch(ahead(*range(10)))
    wait_until(lambda: read_ahead.stats().read == 3)
    time.sleep(0.05)  # the threads would read more now if they could

    assert read_ahead.stats().read == 3
    assert read_ahead.held_bytes == 3 * PAYLOAD
    # Taking blocks makes room for the next ones; each file is read once, in all.
    for n in range(10):
        assert read_ahead.load(hash_of(n), tokens_of(n)) == payload_of(n)
    assert max(counting.held_at_reads) <= 3 * PAYLOAD
    assert set(counting.loads.values()) == {1}


def test_a_later_prompt_pushes_out_what_an_earlier_one_left(reader):
    read_ahead, counting = reader(max_blocks=2)
    read_ahead.prefetch(ahead(0, 1))
    wait_until(lambda: read_ahead.stats().read == 2)

    read_ahead.prefetch(ahead(5, 6))
    wait_until(lambda: read_ahead.stats().read == 4)

    assert read_ahead.stats().dropped == 2 and read_ahead.held_bytes == 2 * PAYLOAD
    assert read_ahead.load(*ahead(5)[0]) == payload_of(5)
    assert read_ahead.load(*ahead(0)[0]) == payload_of(0)
    assert counting.loads[hash_of(0)] == 2 and counting.loads[hash_of(5)] == 1


def test_discarded_blocks_free_their_memory_and_are_read_again_if_asked(reader):
    read_ahead, counting = reader()
    read_ahead.prefetch(ahead(0, 1))
    wait_until(lambda: read_ahead.stats().read == 2)

    read_ahead.discard([hash_of(0), hash_of(1)])

    assert read_ahead.held_bytes == 0 and read_ahead.stats().dropped == 2
    assert read_ahead.load(*ahead(0)[0]) == payload_of(0)
    assert counting.loads[hash_of(0)] == 2


def test_clearing_forgets_what_was_read_and_what_is_being_read(reader):
    read_ahead, counting = reader(num_threads=1)
    counting.hold.add(hash_of(1))
    read_ahead.prefetch(ahead(0, 1))
    assert counting.reading.wait(10)

    read_ahead.clear()
    counting.release.set()
    wait_until(lambda: read_ahead.stats().read == 2)

    assert read_ahead.held_bytes == 0 and read_ahead.stats().dropped == 2
    assert read_ahead.load(*ahead(1)[0]) == payload_of(1)
    assert counting.loads[hash_of(1)] == 2  # the read under way was not kept


def reader_threads() -> int:
    return sum(t.name == THREAD_NAME for t in threading.enumerate())


def test_threads_start_at_the_first_prefetch_and_stop_at_close(reader):
    before = reader_threads()
    read_ahead, _ = reader(num_threads=2)
    assert reader_threads() == before
    read_ahead.prefetch(ahead(0))
    wait_until(lambda: read_ahead.stats().read == 1)
    assert reader_threads() == before + 2

    read_ahead.close(timeout=10)
    read_ahead.prefetch(ahead(2))

    assert reader_threads() == before
    assert read_ahead.load(*ahead(2)[0]) == payload_of(2)  # read when asked, not ahead
    assert read_ahead.stats().read == 1


def test_a_load_served_by_the_read_ahead_is_costed_by_its_wait_alone(tmp_path):
    kv = [(torch.randn(8, 4, 2, 3), torch.randn(8, 4, 2, 3)) for _ in range(3)]
    io = KVBlockIO(kv)
    store = DiskBlockStore(tmp_path, FINGERPRINT, MiB)
    store.save([(hash_of(n), tokens_of(n), bytes(p)) for n, p in enumerate(io.copy_out([0, 1]))])
    refs = [BlockRef(4 + n, hash_of(n), tokens_of(n)) for n in range(2)]

    def tier() -> DiskPrefixCache:
        slow = CountingStore(store, delay=0.05)
        return DiskPrefixCache(slow, writer=None, io=io,
                               read_ahead=ReadAhead(slow, io.bytes_per_block, num_threads=2))

    cold, ahead = tier(), tier()
    ahead.prefetch([(r.block_hash, r.token_ids) for r in refs])
    wait_until(lambda: ahead.read_ahead.stats().read == 2)

    assert cold.load(refs) == 2 and ahead.load(refs) == 2
    assert cold.read_s_per_block >= 0.05
    assert ahead.read_s_per_block < cold.read_s_per_block / 4
    for k, v in kv:
        assert torch.equal(k[4], k[0]) and torch.equal(v[5], v[1])
    ahead.read_ahead.close()
