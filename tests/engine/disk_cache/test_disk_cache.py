"""The disk store under the prefix cache: what it saved comes back byte for byte, and anything
else (a corrupt, truncated or foreign file, another model's blocks, a full or read-only disk)
is a miss, never wrong data and never an exception."""

import errno
import logging
import os
import random
import stat
import struct
import threading
import time
from collections import OrderedDict
from hashlib import blake2b
from pathlib import Path

import pytest

from pagoda.engine.disk_cache import store as disk_cache
from pagoda.engine.disk_cache.store import DiskBlockStore

FINGERPRINT = "ab" * 16
OTHER_FINGERPRINT = "cd" * 16
BLOCK_SIZE = 16
MiB = 1 << 20

needs_permissions = pytest.mark.skipif(os.geteuid() == 0, reason="root ignores file permissions")


def tokens_of(n: int) -> tuple[int, ...]:
    return tuple(range(n * BLOCK_SIZE, (n + 1) * BLOCK_SIZE))


def hash_of(n: int) -> bytes:
    return blake2b(repr(tokens_of(n)).encode(), digest_size=16).digest()


def block(n: int, payload_size: int = 256) -> tuple[bytes, tuple[int, ...], bytes]:
    payload = bytes((n + i) % 251 for i in range(payload_size))
    return hash_of(n), tokens_of(n), payload


def file_of(store: DiskBlockStore, n: int) -> Path:
    name = hash_of(n).hex()
    return store.folder / store.fingerprint / name[:2] / f"{name}.kv"


def block_files(folder: Path) -> list[Path]:
    return sorted(folder.rglob("*.kv"))


def file_size(payload_size: int, tmp_path: Path) -> int:
    """What one block of this payload size takes on disk (header included)."""
    store = DiskBlockStore(tmp_path / "measure", FINGERPRINT, MiB)
    store.save([block(0, payload_size)])
    return store.stats().size_bytes


@pytest.fixture
def store(tmp_path) -> DiskBlockStore:
    return DiskBlockStore(tmp_path / "kv", FINGERPRINT, capacity_bytes=MiB)


def test_saved_block_loads_back_identical(store):
    block_hash, tokens, payload = block(1)
    store.save([(block_hash, tokens, payload)])

    assert store.contains(block_hash)
    assert store.load(block_hash, tokens) == payload
    stats = store.stats()
    assert (stats.num_blocks, stats.hits, stats.misses, stats.errors) == (1, 1, 0, 0)
    assert stats.size_bytes == file_of(store, 1).stat().st_size
    assert stats.bytes_written == stats.bytes_read == stats.size_bytes


def test_payload_may_be_any_buffer(store):
    block_hash, tokens, payload = block(1)
    store.save([(block_hash, tokens, memoryview(bytearray(payload)))])
    assert store.load(block_hash, tokens) == payload


def test_unknown_block_is_a_miss(store):
    assert not store.contains(hash_of(7))
    assert store.load(hash_of(7), tokens_of(7)) is None
    assert store.stats().misses == 1


def test_other_token_ids_never_get_the_payload(store):
    block_hash, tokens, _ = block(1)
    store.save([block(1)])

    assert store.load(block_hash, tokens_of(2)) is None
    assert store.load(block_hash, tokens[:-1]) is None


def test_saving_a_block_twice_writes_it_once(store):
    store.save([block(1), block(1)])
    store.save([block(1)])
    assert store.stats().bytes_written == store.stats().size_bytes
    assert len(block_files(store.folder)) == 1


def _truncate(path: Path) -> None:
    path.write_bytes(path.read_bytes()[:-10])


def _flip_payload_byte(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[-5] ^= 0xFF
    path.write_bytes(bytes(data))


def _wrong_magic(path: Path) -> None:
    path.write_bytes(b"GGUF" + path.read_bytes()[4:])


def _future_version(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[4] += 1
    path.write_bytes(bytes(data))


def _empty(path: Path) -> None:
    path.write_bytes(b"")


def _garbage(path: Path) -> None:
    path.write_bytes(os.urandom(300))


@pytest.mark.parametrize(
    "damage", [_truncate, _flip_payload_byte, _wrong_magic, _future_version, _empty, _garbage]
)
def test_damaged_file_is_a_miss_and_is_removed(store, damage):
    store.save([block(1), block(2)])
    damage(file_of(store, 1))

    assert store.load(hash_of(1), tokens_of(1)) is None
    assert not file_of(store, 1).exists()
    assert not store.contains(hash_of(1))
    assert store.stats().errors == 1
    # The store keeps working.
    assert store.load(*block(2)[:2]) == block(2)[2]
    store.save([block(1)])
    assert store.load(*block(1)[:2]) == block(1)[2]


def _as_version_1(path: Path, token_ids: tuple[int, ...], payload: bytes) -> None:
    """Rewrite a block file as the first format wrote it (a blake2b-128 of the payload)."""
    header = struct.pack("<4sHHIQ16s", b"PGKV", 1, len(FINGERPRINT), len(token_ids), len(payload),
                         blake2b(payload, digest_size=16).digest())
    path.write_bytes(header + FINGERPRINT.encode()
                     + struct.pack(f"<{len(token_ids)}q", *token_ids) + payload)


def test_a_file_of_the_first_format_is_a_miss_and_is_removed(tmp_path):
    folder = tmp_path / "kv"
    first = DiskBlockStore(folder, FINGERPRINT, MiB)
    first.save([block(1), block(2)])
    block_hash, tokens, payload = block(1)
    _as_version_1(file_of(first, 1), tokens, payload)  # as a Pagoda of version 1 left it

    upgraded = DiskBlockStore(folder, FINGERPRINT, MiB)

    assert upgraded.contains(block_hash)  # by its name, until it is read
    assert upgraded.load(block_hash, tokens) is None
    assert not file_of(upgraded, 1).exists() and not upgraded.contains(block_hash)
    assert upgraded.stats().errors == 1
    assert upgraded.load(*block(2)[:2]) == block(2)[2]


def test_damaged_files_are_logged_once(store, caplog):
    store.save([block(n) for n in range(5)])
    for n in range(5):
        _flip_payload_byte(file_of(store, n))

    with caplog.at_level(logging.WARNING, logger="pagoda.engine.disk_cache.store"):
        for n in range(5):
            assert store.load(hash_of(n), tokens_of(n)) is None

    assert len([r for r in caplog.records if r.levelno == logging.WARNING]) == 1
    assert store.stats().errors == 5


def test_other_models_blocks_are_never_looked_at(tmp_path):
    first = DiskBlockStore(tmp_path, FINGERPRINT, MiB)
    first.save([block(1)])

    other = DiskBlockStore(tmp_path, OTHER_FINGERPRINT, MiB)

    assert not other.contains(hash_of(1))
    assert other.load(hash_of(1), tokens_of(1)) is None
    assert first.load(hash_of(1), tokens_of(1)) == block(1)[2]


def test_another_models_file_in_our_folder_is_rejected(tmp_path):
    first = DiskBlockStore(tmp_path, FINGERPRINT, MiB)
    first.save([block(1)])
    foreign = file_of(first, 1)
    ours = tmp_path / OTHER_FINGERPRINT / foreign.parent.name / foreign.name
    ours.parent.mkdir(parents=True)
    ours.write_bytes(foreign.read_bytes())

    other = DiskBlockStore(tmp_path, OTHER_FINGERPRINT, MiB)

    assert other.contains(hash_of(1))  # the index trusts names; load checks the contents
    assert other.load(hash_of(1), tokens_of(1)) is None
    assert not ours.exists()
    assert foreign.exists()


def test_invalid_fingerprint_is_refused(tmp_path):
    for fingerprint in ["", "../escape", "AB12", "model name"]:
        with pytest.raises(ValueError, match="fingerprint"):
            DiskBlockStore(tmp_path, fingerprint, MiB)


def test_size_stays_within_capacity_and_recent_blocks_survive(tmp_path):
    """A random sequence of saves and loads against a plain LRU model of what should remain."""
    overhead = file_size(0, tmp_path)
    for seed in range(40):
        rng = random.Random(seed)
        capacity = rng.randrange(0, 12) * (overhead + 64)
        store = DiskBlockStore(tmp_path / f"seed{seed}", FINGERPRINT, capacity)
        expected: OrderedDict[bytes, int] = OrderedDict()
        for _ in range(30):
            if rng.random() < 0.6:
                batch = [block(n, rng.randrange(0, 128)) for n in rng.sample(range(24), 3)]
                store.save(batch)
                _apply_save(expected, batch, overhead, capacity)
                assert store.stats().size_bytes <= capacity, f"seed {seed}"
            else:
                n = rng.randrange(24)
                payload = store.load(hash_of(n), tokens_of(n))
                assert (payload is not None) == (hash_of(n) in expected), f"seed {seed}"
                if payload is not None:
                    expected.move_to_end(hash_of(n))
            on_disk = {bytes.fromhex(p.stem) for p in block_files(store.folder)}
            assert on_disk == set(expected), f"seed {seed}"
            assert store.stats().size_bytes == sum(expected.values())


def _apply_save(expected: OrderedDict, batch: list, overhead: int, capacity: int) -> None:
    for block_hash, _, payload in batch:
        if block_hash not in expected and overhead + len(payload) <= capacity:
            expected[block_hash] = overhead + len(payload)
    while sum(expected.values()) > capacity:
        expected.popitem(last=False)


def test_lru_order_survives_reopen(tmp_path):
    capacity = 3 * file_size(256, tmp_path)
    store = DiskBlockStore(tmp_path / "kv", FINGERPRINT, capacity)
    store.save([block(1), block(2), block(3)])
    store.load(hash_of(1), tokens_of(1))

    reopened = DiskBlockStore(tmp_path / "kv", FINGERPRINT, capacity)
    reopened.save([block(4)])

    assert [reopened.contains(hash_of(n)) for n in (1, 2, 3, 4)] == [True, False, True, True]


def test_lower_capacity_on_reopen_removes_least_recently_used(tmp_path):
    one_block = file_size(256, tmp_path)
    store = DiskBlockStore(tmp_path / "kv", FINGERPRINT, 3 * one_block)
    store.save([block(1), block(2), block(3)])
    store.load(hash_of(1), tokens_of(1))

    smaller = DiskBlockStore(tmp_path / "kv", FINGERPRINT, 2 * one_block)

    assert [smaller.contains(hash_of(n)) for n in (1, 2, 3)] == [True, False, True]
    assert len(block_files(tmp_path / "kv")) == 2


def test_second_store_sees_first_stores_blocks_after_construction(tmp_path):
    first = DiskBlockStore(tmp_path, FINGERPRINT, MiB)
    first.save([block(1)])

    second = DiskBlockStore(tmp_path, FINGERPRINT, MiB)

    assert second.load(hash_of(1), tokens_of(1)) == block(1)[2]


def test_file_removed_by_another_process_is_a_plain_miss(tmp_path):
    first = DiskBlockStore(tmp_path, FINGERPRINT, MiB)
    first.save([block(1)])
    second = DiskBlockStore(tmp_path, FINGERPRINT, MiB)

    assert first.remove([hash_of(1)]) == 1

    assert second.load(hash_of(1), tokens_of(1)) is None
    assert not second.contains(hash_of(1))
    assert second.stats().errors == 0


def test_remove_deletes_the_blocks_files(store):
    store.save([block(1), block(2), block(3)])

    assert store.remove([hash_of(1), hash_of(3), hash_of(9)]) == 2

    assert [store.contains(hash_of(n)) for n in (1, 2, 3)] == [False, True, False]
    assert block_files(store.folder) == [file_of(store, 2)]
    assert store.stats().size_bytes == file_of(store, 2).stat().st_size


def test_clear_removes_every_models_blocks_and_keeps_the_folder(tmp_path):
    first = DiskBlockStore(tmp_path / "kv", FINGERPRINT, MiB)
    other = DiskBlockStore(tmp_path / "kv", OTHER_FINGERPRINT, MiB)
    first.save([block(1), block(2)])
    other.save([block(3)])
    unrelated = tmp_path / "kv" / "README.txt"
    unrelated.write_text("not ours")

    first.clear()

    assert block_files(tmp_path / "kv") == []
    assert sorted(p.name for p in (tmp_path / "kv").iterdir()) == ["README.txt"]
    assert first.stats().num_blocks == first.stats().size_bytes == 0
    assert other.load(hash_of(3), tokens_of(3)) is None
    first.save([block(1)])
    assert first.load(hash_of(1), tokens_of(1)) == block(1)[2]


def test_folders_are_private(tmp_path):
    folder = tmp_path / "kv"
    folder.mkdir(mode=0o755)
    os.chmod(folder, 0o755)
    store = DiskBlockStore(folder, FINGERPRINT, MiB)
    store.save([block(1)])

    path = file_of(store, 1)
    for created in (folder, path.parent.parent, path.parent):
        assert stat.S_IMODE(created.stat().st_mode) == 0o700, created
    assert stat.S_IMODE(path.stat().st_mode) & 0o077 == 0


def test_stale_temp_files_are_removed_at_construction(tmp_path):
    store = DiskBlockStore(tmp_path, FINGERPRINT, MiB)
    store.save([block(1)])
    shard = file_of(store, 1).parent
    stale, fresh = (
        shard / f"{hash_of(1).hex()}.kv.old.tmp",
        shard / f"{hash_of(1).hex()}.kv.new.tmp",
    )
    stale.write_bytes(b"partial")
    fresh.write_bytes(b"partial")
    an_hour_ago = time.time() - 3600
    os.utime(stale, (an_hour_ago, an_hour_ago))

    DiskBlockStore(tmp_path, FINGERPRINT, MiB)

    assert not stale.exists()
    assert fresh.exists()  # may belong to another process writing right now


@needs_permissions
def test_read_only_folder_is_not_written_and_does_not_raise(tmp_path, caplog):
    folder = tmp_path / "kv"
    folder.mkdir()
    os.chmod(folder, 0o500)
    try:
        with caplog.at_level(logging.WARNING, logger="pagoda.engine.disk_cache.store"):
            store = DiskBlockStore(folder, FINGERPRINT, MiB)
            store.save([block(1)])
            store.save([block(2)])
        assert not store.contains(hash_of(1))
        assert store.load(hash_of(1), tokens_of(1)) is None
        assert block_files(folder) == []
        assert len([r for r in caplog.records if r.levelno == logging.WARNING]) == 1
    finally:
        os.chmod(folder, 0o700)


@needs_permissions
def test_folder_made_read_only_later_stops_writes_quietly(store):
    store.save([block(1)])
    fingerprint_folder = store.folder / store.fingerprint
    os.chmod(fingerprint_folder, 0o500)
    try:
        store.save([block(2), block(3)])
        assert store.load(hash_of(1), tokens_of(1)) == block(1)[2]
        assert not store.contains(hash_of(2))
        assert store.stats().errors >= 1
    finally:
        os.chmod(fingerprint_folder, 0o700)
    assert block_files(store.folder) == [file_of(store, 1)]


def test_full_disk_stops_the_batch_and_leaves_no_temp_file(store, monkeypatch):
    real_fdopen = os.fdopen

    class FullDisk:
        def __init__(self, fd, mode):
            self.file = real_fdopen(fd, mode)

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            self.file.close()

        def write(self, data):
            raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(disk_cache.os, "fdopen", FullDisk)
    store.save([block(1), block(2)])
    monkeypatch.undo()

    assert not store.contains(hash_of(1)) and not store.contains(hash_of(2))
    assert [p for p in store.folder.rglob("*") if p.is_file()] == []
    assert store.stats().errors == 1
    store.save([block(1)])
    assert store.load(hash_of(1), tokens_of(1)) == block(1)[2]


def test_loads_during_background_saves_are_right_or_misses(tmp_path):
    capacity = 20 * file_size(256, tmp_path)
    store = DiskBlockStore(tmp_path / "kv", FINGERPRINT, capacity)
    failures = []

    def save_many():
        for start in range(0, 200, 4):
            store.save([block(n) for n in range(start, start + 4)])

    writer = threading.Thread(target=save_many)
    writer.start()
    while writer.is_alive():
        for n in range(0, 200, 7):
            payload = store.load(hash_of(n), tokens_of(n))
            if payload is not None and payload != block(n)[2]:
                failures.append(n)
    writer.join()

    assert failures == []
    assert store.stats().errors == 0
    assert store.stats().size_bytes <= capacity


def test_block_larger_than_capacity_is_not_written(tmp_path):
    one_block = file_size(256, tmp_path)
    store = DiskBlockStore(tmp_path / "kv", FINGERPRINT, 2 * one_block)
    store.save([block(1)])

    store.save([block(2, payload_size=4 * one_block)])

    assert store.contains(hash_of(1)) and not store.contains(hash_of(2))
    assert store.stats().bytes_written == one_block


def test_the_folder_size_and_clearing_cover_every_models_blocks_without_a_store(tmp_path):
    from pagoda.engine.disk_cache.store import clear_folder, folder_size

    for fingerprint in ("aa11", "bb22"):
        DiskBlockStore(tmp_path, fingerprint, 1 << 20).save(
            [(bytes([n]) * 16, (n, n + 1), b"x" * 100) for n in range(3)])
    (tmp_path / "notes.txt").write_text("not ours")
    assert folder_size(tmp_path) == sum(f.stat().st_size for f in tmp_path.rglob("*.kv")) > 600

    clear_folder(tmp_path)

    assert folder_size(tmp_path) == 0 and not list(tmp_path.rglob("*.kv"))
    assert (tmp_path / "notes.txt").exists()
    assert folder_size(tmp_path / "missing") == 0


# Symbolic links put in the cache's place are never written through


@pytest.fixture
def decoy(tmp_path) -> Path:
    folder = tmp_path / "elsewhere"
    folder.mkdir()
    (folder / "precious.txt").write_text("keep me\n")
    return folder


def untouched(decoy: Path) -> bool:
    return [p.name for p in decoy.iterdir()] == ["precious.txt"] and \
        (decoy / "precious.txt").read_text() == "keep me\n"


def test_a_shard_folder_replaced_by_a_link_is_not_written_through(store, decoy, caplog):
    shard = file_of(store, 1).parent
    shard.parent.mkdir(parents=True, exist_ok=True)
    shard.symlink_to(decoy, target_is_directory=True)
    with caplog.at_level(logging.WARNING, logger="pagoda.engine.disk_cache.store"):
        store.save([block(1)])
    assert untouched(decoy)
    assert not store.contains(hash_of(1))
    assert store.stats().errors == 1
    assert "symbolic link" in caplog.text and str(shard) in caplog.text


def test_a_fingerprint_folder_replaced_by_a_link_is_not_written_through(tmp_path, decoy):
    folder = tmp_path / "kv"
    folder.mkdir()
    (folder / FINGERPRINT).symlink_to(decoy, target_is_directory=True)
    store = DiskBlockStore(folder, FINGERPRINT, MiB)
    store.save([block(1), block(2)])
    store.record_tags({"chat-a": [hash_of(1)]})
    assert untouched(decoy)
    assert store.stats().num_blocks == 0 and store.stats().errors >= 1


def test_a_tag_file_replaced_by_a_link_is_not_appended_to(store, decoy, caplog):
    store.record_tags({"chat-a": [hash_of(1)]})
    tag_file = store.folder / store.fingerprint / disk_cache.TAGS_FOLDER / "chat-a.hashes"
    tag_file.unlink()
    tag_file.symlink_to(decoy / "precious.txt")
    with caplog.at_level(logging.WARNING, logger="pagoda.engine.disk_cache.store"):
        store.record_tags({"chat-a": [hash_of(2)]})
    assert untouched(decoy)
    assert store.stats().errors == 1 and str(tag_file) in caplog.text


def test_a_tags_folder_replaced_by_a_link_is_not_written_through(store, decoy):
    (store.folder / store.fingerprint / disk_cache.TAGS_FOLDER).symlink_to(
        decoy, target_is_directory=True)
    store.record_tags({"chat-a": [hash_of(1)]})
    assert untouched(decoy)
    assert store.stats().errors == 1


def test_a_hit_on_a_block_file_replaced_by_a_link_stamps_the_link_not_its_target(store, decoy):
    store.save([block(1)])
    path = file_of(store, 1)
    foreign = decoy / "copy.kv"
    path.rename(foreign)
    path.symlink_to(foreign)
    a_day_ago = time.time_ns() - 86_400 * 10**9
    os.utime(foreign, ns=(a_day_ago, a_day_ago))
    store.load(hash_of(1), tokens_of(1))
    assert foreign.stat().st_mtime_ns == a_day_ago


def test_tag_files_are_private_in_private_folders(store):
    store.record_tags({"chat-a": [hash_of(1)]})
    tags = store.folder / store.fingerprint / disk_cache.TAGS_FOLDER
    assert stat.S_IMODE(tags.stat().st_mode) == 0o700
    assert stat.S_IMODE((tags / "chat-a.hashes").stat().st_mode) == 0o600


def test_a_tag_file_an_older_version_left_readable_is_made_private(store):
    tags = store.folder / store.fingerprint / disk_cache.TAGS_FOLDER
    tags.mkdir(mode=0o700)
    (tags / "chat-a.hashes").write_text(hash_of(1).hex() + "\n")
    os.chmod(tags / "chat-a.hashes", 0o644)
    store.record_tags({"chat-a": [hash_of(2)]})
    assert stat.S_IMODE((tags / "chat-a.hashes").stat().st_mode) == 0o600
    assert (tags / "chat-a.hashes").read_text().split() == [hash_of(1).hex(), hash_of(2).hex()]


def test_a_cache_folder_that_is_itself_a_link_is_the_users_choice_and_is_used(tmp_path):
    real = tmp_path / "other-disk"
    real.mkdir()
    (tmp_path / "kv").symlink_to(real, target_is_directory=True)
    store = DiskBlockStore(tmp_path / "kv", FINGERPRINT, MiB)
    store.save([block(1)])
    assert store.load(hash_of(1), tokens_of(1)) == block(1)[2]
    assert block_files(real)
