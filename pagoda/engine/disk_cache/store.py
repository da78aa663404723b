"""Full KV cache blocks kept on disk, so a prefix computed before a restart is found again.

One file per block: ``folder/<fingerprint>/<first two hex digits>/<hash hex>.kv``. The fingerprint
names the model weights, dtype, block size and KV layout, so another model never looks at these
files. The store knows nothing of tensors: a block is its chained hash, its token ids and an opaque
payload of bytes.

A file is a header, the fingerprint, the token ids and the payload::

    magic b"PGKV" | version u16 | fingerprint length u16 | token count u32 | payload length u64
    | XXH3-64 of the payload u64 | fingerprint (ASCII) | token ids (int64 each) | payload

all little-endian. Every field is checked before a payload is handed out: a truncated, corrupt or
foreign file is a miss (and is removed), never wrong data. The checksum guards against a damaged
disk or a torn file, not against someone who can write the folder (only the user: 0700), so it
is a fast non-cryptographic hash (version 2): on a 2-core AMD EPYC, version 1's blake2b-128 of
a default-model block (737 KB) took 1.6 ms, ten times the rest of reading the file; zlib's CRC-32
takes 0.4 ms, XXH3 0.015. A file of another version is a miss like any other foreign file.

Cache tags say which blocks a chat used: ``folder/<fingerprint>/tags/<tag>.hashes`` lists the
hex hash of each block a request with that tag found or saved, one a line (appended to, so a
hash may repeat). `forget_tag` removes the blocks only one tag used, when its chat is deleted.
"""

from __future__ import annotations

import logging
import os
import re
import stat
import struct
import tempfile
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import xxhash

logger = logging.getLogger(__name__)

MAGIC = b"PGKV"
FORMAT_VERSION = 2
_HEADER = struct.Struct("<4sHHIQQ")
_BLOCK_SUFFIX = ".kv"
_TEMP_SUFFIX = ".tmp"
# A temp file this old belongs to a writer that died; a younger one may still be in use.
_STALE_TEMP_NS = 60 * 1_000_000_000
_HEX_DIGITS = frozenset("0123456789abcdef")
TAGS_FOLDER = "tags"
_TAG_SUFFIX = ".hashes"
_TAG_PATTERN = re.compile(r"[A-Za-z0-9._-]{1,100}")


@dataclass(frozen=True, slots=True)
class DiskCacheStats:
    """Sizes are bytes of block files; hits and misses count `load` calls; bytes_read counts
    the files read on hits; errors counts unusable files and failed reads, writes or removals."""

    num_blocks: int
    size_bytes: int
    capacity_bytes: int
    hits: int
    misses: int
    bytes_read: int
    bytes_written: int
    errors: int


class _BadBlockFile(Exception):
    """A block file that must not be used; the message says why."""


class UnsafeCachePathError(OSError):
    """A folder the store writes into is a symbolic link or not a folder: someone else put it
    there, and writing would land outside the cache."""


def _private_folder(path: Path) -> None:
    """Make path (mode 0700) unless it exists, and check it is a real folder: mkdir's
    exist_ok and every later write would follow a symbolic link put in its place."""
    try:
        path.mkdir(mode=0o700)
    except FileExistsError:
        pass
    mode = os.lstat(path).st_mode
    if stat.S_ISLNK(mode) or not stat.S_ISDIR(mode):
        raise UnsafeCachePathError(
            f"{path} is {'a symbolic link' if stat.S_ISLNK(mode) else 'not a folder'}, not "
            "a folder of the cache's own; nothing is written through it. Remove it, or clear "
            "the cache")


def _append_private(path: Path, text: str) -> None:
    """Append to path, made 0600, never through a symbolic link (O_NOFOLLOW) nor into anything
    but a plain file."""
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC
                 | os.O_NONBLOCK, 0o600)
    with os.fdopen(fd, "a", encoding="ascii") as f:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise UnsafeCachePathError(f"{path} is not a plain file; nothing is written to it")
        os.fchmod(fd, 0o600)  # a file an older version made 0644
        f.write(text)


def _checksum(payload: bytes | memoryview) -> int:
    return xxhash.xxh3_64_intdigest(payload)


def _encode_tokens(token_ids: Sequence[int]) -> bytes:
    return struct.pack(f"<{len(token_ids)}q", *token_ids)


def _encode_header(fingerprint: bytes, token_ids: Sequence[int], payload: memoryview) -> bytes:
    fixed = _HEADER.pack(
        MAGIC, FORMAT_VERSION, len(fingerprint), len(token_ids), payload.nbytes, _checksum(payload)
    )
    return fixed + fingerprint + _encode_tokens(token_ids)


def _is_hex(name: str) -> bool:
    return bool(name) and set(name) <= _HEX_DIGITS


def check_cache_tag(tag: str) -> None:
    """Raise ValueError unless `tag` can name a tag file."""
    if not isinstance(tag, str) or not _TAG_PATTERN.fullmatch(tag):
        raise ValueError(f"cache_tag {tag!r} must be 1 to 100 letters, digits, '.', '_' or '-' "
                         "(it names a file)")


class DiskBlockStore:
    """Block files of one model fingerprint, with an in-memory LRU index of them.

    Thread-safe: `save` may run on a writer thread while `contains` and `load` run on the
    engine's, and `load` on the read-ahead's too (pagoda.engine.disk_cache.read_ahead). I/O and format
    problems never raise: they are counted in `stats`, logged once per store, and the block is
    treated as absent."""

    def __init__(self, folder: Path, fingerprint: str, capacity_bytes: int) -> None:
        if not _is_hex(fingerprint):
            raise ValueError(f"fingerprint {fingerprint!r} must be a lowercase hex string")
        if capacity_bytes < 0:
            raise ValueError(f"capacity_bytes={capacity_bytes} must be >= 0")
        self.folder = Path(folder)
        self.fingerprint = fingerprint
        self.capacity_bytes = capacity_bytes
        self._root = self.folder / fingerprint
        self._fingerprint_bytes = fingerprint.encode("ascii")
        self._lock = threading.Lock()
        # Block hash -> file size; the front was used longest ago.
        self._index: OrderedDict[bytes, int] = OrderedDict()
        self._size = 0
        # Every write and hit stamps its file's mtime with a fresh, strictly increasing time,
        # so the LRU order survives a restart even where the clock's ticks are coarse.
        self._last_stamp_ns = 0
        # Bumped by clear(), so a write that raced with it is removed rather than kept.
        self._generation = 0
        self._hits = self._misses = self._bytes_read = self._bytes_written = self._errors = 0
        self._warned = False
        if self._make_folders():
            self._scan()
            self._evict_over_capacity()

    # --- lookups (engine thread) ---

    def contains(self, block_hash: bytes) -> bool:
        with self._lock:
            return block_hash in self._index

    def load(self, block_hash: bytes, token_ids: tuple[int, ...]) -> bytes | None:
        """The payload saved for this hash and these exact token ids, or None."""
        with self._lock:
            if block_hash not in self._index:
                self._misses += 1
                return None
        path = self._path(block_hash)
        try:
            payload, file_size = self._read(path, token_ids)
        except FileNotFoundError:
            # Another process evicted or cleared it: a plain miss.
            self._forget(block_hash, miss=True)
            return None
        except (OSError, _BadBlockFile) as exc:
            self._forget(block_hash, miss=True)
            self._unlink(path)
            self._report(f"unusable block file {path}", exc)
            return None
        self._mark_used(block_hash, path, file_size)
        return payload

    # --- writes (writer thread) ---

    def save(self, blocks: Sequence[tuple[bytes, tuple[int, ...], bytes]]) -> None:
        """Write the blocks not on disk yet, then remove least recently used ones past capacity.

        A block larger than the whole capacity is skipped. A write that fails (full disk,
        read-only folder) ends the batch; the next batch tries again."""
        for block_hash, token_ids, payload in blocks:
            with self._lock:
                if block_hash in self._index:
                    continue
                generation = self._generation
            if not self._write(block_hash, token_ids, payload, generation):
                break
        self._evict_over_capacity()

    def record_tags(self, tags: Mapping[str, Iterable[bytes]]) -> None:
        """Append these block hashes to their tags' files (which blocks each tag used)."""
        if not tags:
            return
        folder = self._root / TAGS_FOLDER
        try:
            self._private_folders(folder)
        except OSError as exc:
            self._report(f"could not create {folder}", exc)
            return
        for tag, hashes in tags.items():
            path = folder / (tag + _TAG_SUFFIX)
            try:
                _append_private(path, "".join(h.hex() + "\n" for h in hashes))
            except OSError as exc:
                self._report(f"could not write {path}", exc)

    def remove(self, hashes: Iterable[bytes]) -> int:
        """Delete these blocks' files (also ones only another process knew of); how many."""
        hashes = list(hashes)
        for block_hash in hashes:
            self._forget(block_hash)
        return sum(self._unlink(self._path(block_hash)) for block_hash in hashes)

    def clear(self) -> None:
        """Delete the blocks of every fingerprint under the folder; the folder itself stays."""
        with self._lock:
            self._index.clear()
            self._size = 0
            self._generation += 1
        clear_folder(self.folder, self._report)

    def stats(self) -> DiskCacheStats:
        with self._lock:
            return DiskCacheStats(
                num_blocks=len(self._index),
                size_bytes=self._size,
                capacity_bytes=self.capacity_bytes,
                hits=self._hits,
                misses=self._misses,
                bytes_read=self._bytes_read,
                bytes_written=self._bytes_written,
                errors=self._errors,
            )

    # --- files ---

    def _path(self, block_hash: bytes) -> Path:
        name = block_hash.hex()
        return self._root / name[:2] / (name + _BLOCK_SUFFIX)

    def _private_folders(self, *paths: Path) -> None:
        """The fingerprint folder, then paths (below it), each a real folder of ours. The
        cache folder itself is the user's choice and may be a link (to another disk)."""
        for path in (self._root, *paths):
            _private_folder(path)

    def _make_folders(self) -> bool:
        try:
            self.folder.mkdir(mode=0o700, parents=True, exist_ok=True)
            self._private_folders()
        except OSError as exc:
            self._report(f"could not create {self._root}", exc)
            return False
        try:
            os.chmod(self.folder, 0o700)
        except OSError as exc:
            self._report(f"could not make {self.folder} private (mode 0700)", exc)
        return True

    def _scan(self) -> None:
        """Index the files already on disk, least recently used first; drop stale temp files."""
        found: list[tuple[int, bytes, int]] = []
        try:
            with os.scandir(self._root) as shards:
                shard_paths = [s.path for s in shards if _is_shard_folder(s)]
        except OSError as exc:
            self._report(f"could not list {self._root}", exc)
            return
        now_ns = time.time_ns()
        for shard_path in shard_paths:
            found.extend(self._scan_shard(shard_path, now_ns))
        found.sort()
        with self._lock:
            for mtime_ns, block_hash, size in found:
                self._index[block_hash] = size
                self._size += size
            if found:
                self._last_stamp_ns = max(self._last_stamp_ns, found[-1][0])

    def _scan_shard(self, shard_path: str, now_ns: int) -> list[tuple[int, bytes, int]]:
        found = []
        shard = os.path.basename(shard_path)
        try:
            with os.scandir(shard_path) as entries:
                for entry in entries:
                    try:
                        found.extend(self._scan_file(entry, shard, now_ns))
                    except FileNotFoundError:
                        continue  # removed by another process while we looked
        except OSError as exc:
            self._report(f"could not list {shard_path}", exc)
        return found

    def _scan_file(
        self, entry: os.DirEntry, shard: str, now_ns: int
    ) -> list[tuple[int, bytes, int]]:
        """[(mtime, hash, size)] for a block file where its hash says; [] for anything else."""
        if not entry.is_file(follow_symlinks=False):
            return []
        name = entry.name
        if name.endswith(_TEMP_SUFFIX):
            if now_ns - entry.stat(follow_symlinks=False).st_mtime_ns > _STALE_TEMP_NS:
                self._unlink(Path(entry.path))
            return []
        block_hash = _hash_of_block_file(name)
        if block_hash is None or not name.startswith(shard):
            return []  # not where load() would look for it
        st = entry.stat(follow_symlinks=False)
        return [(st.st_mtime_ns, block_hash, st.st_size)]

    def _read(self, path: Path, token_ids: tuple[int, ...]) -> tuple[bytes, int]:
        """The verified payload and the file's size; raises _BadBlockFile or OSError."""
        expected_prefix = self._fingerprint_bytes + _encode_tokens(token_ids)
        with open(path, "rb") as f:
            file_size = os.fstat(f.fileno()).st_size
            header = f.read(_HEADER.size)
            if len(header) < _HEADER.size:
                raise _BadBlockFile(f"truncated header ({file_size} bytes)")
            magic, version, fp_len, num_tokens, payload_len, checksum = _HEADER.unpack(header)
            if magic != MAGIC:
                raise _BadBlockFile("not a Pagoda KV block file")
            if version != FORMAT_VERSION:
                raise _BadBlockFile(f"format version {version}, expected {FORMAT_VERSION}")
            if fp_len != len(self._fingerprint_bytes) or num_tokens != len(token_ids):
                raise _BadBlockFile("another model's block or other token ids")
            if file_size != _HEADER.size + len(expected_prefix) + payload_len:
                raise _BadBlockFile(f"size {file_size} does not match its header")
            if f.read(len(expected_prefix)) != expected_prefix:
                raise _BadBlockFile("another model's block or other token ids")
            payload = f.read(payload_len)
        if len(payload) != payload_len or _checksum(payload) != checksum:
            raise _BadBlockFile("payload checksum mismatch")
        return payload, file_size

    def _write(
        self, block_hash: bytes, token_ids: tuple[int, ...], payload: bytes, generation: int
    ) -> bool:
        """Write one block atomically (temp file, then rename); False if the disk refused."""
        path = self._path(block_hash)
        body = memoryview(payload).cast("B")
        header = _encode_header(self._fingerprint_bytes, token_ids, body)
        size = len(header) + body.nbytes
        if size > self.capacity_bytes:
            return True  # it would only push everything else out, then go itself
        temp_path = None
        try:
            # The fingerprint folder too: clear() may have removed it. mkstemp makes a new
            # 0600 file (O_EXCL), and os.replace renames over a link rather than through it.
            self._private_folders(path.parent)
            fd, temp_path = tempfile.mkstemp(
                prefix=path.name + ".", suffix=_TEMP_SUFFIX, dir=path.parent
            )
            with os.fdopen(fd, "wb") as f:
                f.write(header)
                f.write(body)
            stamp = self._next_stamp()
            os.utime(temp_path, ns=(stamp, stamp))
            os.replace(temp_path, path)
        except OSError as exc:
            if temp_path is not None:
                self._unlink(Path(temp_path))
            self._report(f"could not write {path}", exc)
            return False
        with self._lock:
            cleared = generation != self._generation
            if not cleared:
                self._index[block_hash] = size
                self._size += size
                self._bytes_written += size
        if cleared:
            self._unlink(path)
        return True

    def _unlink(self, path: Path) -> bool:
        try:
            path.unlink()
        except FileNotFoundError:
            return False
        except OSError as exc:
            self._report(f"could not remove {path}", exc)
            return False
        return True

    # --- index ---

    def _forget(self, block_hash: bytes, miss: bool = False) -> None:
        with self._lock:
            size = self._index.pop(block_hash, None)
            if size is not None:
                self._size -= size
            if miss:
                self._misses += 1

    def _mark_used(self, block_hash: bytes, path: Path, file_size: int) -> None:
        stamp = self._next_stamp()
        try:
            os.utime(path, ns=(stamp, stamp), follow_symlinks=False)
        except OSError:
            pass  # a read-only folder: the order in memory still holds for this run
        with self._lock:
            self._hits += 1
            self._bytes_read += file_size
            old_size = self._index.get(block_hash)
            if old_size is not None:
                self._index[block_hash] = file_size
                self._index.move_to_end(block_hash)
                self._size += file_size - old_size

    def _evict_over_capacity(self) -> None:
        victims = []
        with self._lock:
            while self._size > self.capacity_bytes and self._index:
                block_hash, size = self._index.popitem(last=False)
                self._size -= size
                victims.append(block_hash)
        for block_hash in victims:
            self._unlink(self._path(block_hash))

    def _next_stamp(self) -> int:
        with self._lock:
            self._last_stamp_ns = max(time.time_ns(), self._last_stamp_ns + 1)
            return self._last_stamp_ns

    def _report(self, what: str, exc: Exception) -> None:
        """Count a problem; log the first of this store as a warning, the rest at debug level."""
        with self._lock:
            self._errors += 1
            first = not self._warned
            self._warned = True
        if first:
            logger.warning(
                "Disk KV cache: %s: %s. Such blocks are recomputed instead; further problems "
                "with this cache are counted in its stats, not logged.",
                what,
                exc,
            )
        else:
            logger.debug("Disk KV cache: %s: %s", what, exc)


def folder_size(folder: Path) -> int:
    """Bytes in block files under `folder`, every model's (what "Clear the cache" frees)."""
    return sum(size for _path, size in _block_files(folder))


def clear_folder(folder: Path, on_error: Callable[[str, Exception], None] | None = None) -> None:
    """Delete every model's blocks under `folder` (with leftover temp files and the tags' lists
    of blocks), leaving the folder
    and anything in it that is not ours. Problems go to `on_error`, else to the log."""
    report = on_error or _log_problem
    for path, _size in _block_files(folder, temp_files=True):
        _unlink_reported(path, report)
    for fingerprint_folder in _subfolders(folder):
        tags = fingerprint_folder / TAGS_FOLDER
        for path in _tag_files(tags):
            _unlink_reported(path, report)
        _remove_empty_folder(tags)
        for shard in _subfolders(fingerprint_folder):
            _remove_empty_folder(shard)
        _remove_empty_folder(fingerprint_folder)


def forget_tag(folder: Path, tag: str) -> int:
    """Delete the block files that `tag` used and no other tag did, every model's under
    `folder`, and the tag's files; returns how many block files were removed. Blocks no tag
    lists (saved by untagged requests) stay. Problems are logged, never raised."""
    check_cache_tag(tag)
    return sum(_forget_tag_in(fingerprint_folder, tag)
               for fingerprint_folder in _subfolders(folder))


def _forget_tag_in(fingerprint_folder: Path, tag: str) -> int:
    tags = fingerprint_folder / TAGS_FOLDER
    if not _is_real_folder(tags):  # no tags here, or a link to someone else's files
        return 0
    own_file = tags / (tag + _TAG_SUFFIX)
    own = _read_tag_file(own_file)
    if not own:
        _unlink_reported(own_file, _log_problem)
        return 0
    for path in _tag_files(tags):
        if path != own_file:
            own -= _read_tag_file(path)
    removed = 0
    for block_hash in own:
        name = block_hash.hex()
        shard = fingerprint_folder / name[:2]
        if _is_real_folder(shard):  # a linked shard's files are someone else's
            removed += _unlink_reported(shard / (name + _BLOCK_SUFFIX), _log_problem)
    _unlink_reported(own_file, _log_problem)
    return removed


def _read_tag_file(path: Path) -> set[bytes]:
    """The block hashes a tag file lists; lines that are not a hash are skipped."""
    try:
        text = path.read_text(encoding="ascii", errors="replace")
    except FileNotFoundError:
        return set()
    except OSError as exc:
        _log_problem(f"could not read {path}", exc)
        return set()
    return {block_hash for line in text.splitlines()
            if (block_hash := _hash_of_hex(line.strip())) is not None}


def _tag_files(folder: Path) -> list[Path]:
    if not _is_real_folder(folder):  # none, or a link to someone else's files
        return []
    try:
        with os.scandir(folder) as entries:
            return [Path(e.path) for e in entries
                    if e.name.endswith(_TAG_SUFFIX) and e.is_file(follow_symlinks=False)]
    except OSError:  # no tags here (or not readable: nothing we can act on)
        return []


def _is_real_folder(path: Path) -> bool:
    try:
        return stat.S_ISDIR(os.lstat(path).st_mode)
    except OSError:
        return False


def _unlink_reported(path: Path, report: Callable[[str, Exception], None]) -> bool:
    try:
        path.unlink()
    except FileNotFoundError:
        return False
    except OSError as exc:
        report(f"could not remove {path}", exc)
        return False
    return True


def _log_problem(what: str, exc: Exception) -> None:
    logger.warning("Disk KV cache: %s: %s", what, exc)


def _block_files(folder: Path, temp_files: bool = False) -> Iterator[tuple[Path, int]]:
    """(path, size) of each block file of every fingerprint under `folder`."""
    for fingerprint_folder in _subfolders(folder):
        for shard in _subfolders(fingerprint_folder):
            try:
                with os.scandir(shard) as entries:
                    found = [(Path(e.path), e.stat(follow_symlinks=False).st_size)
                             for e in entries if _is_block_or_temp_file(e)
                             and (temp_files or e.name.endswith(_BLOCK_SUFFIX))]
            except OSError:  # removed meanwhile (another Pagoda clearing): nothing to count
                continue
            yield from found


def _subfolders(folder: Path) -> list[Path]:
    """The fingerprint (or shard) folders in `folder`; none when it cannot be listed."""
    try:
        with os.scandir(folder) as entries:
            return [Path(e.path) for e in entries if _is_hex_folder(e)]
    except OSError:
        return []


def _is_hex_folder(entry: os.DirEntry) -> bool:
    """A folder named like a fingerprint or a shard: the only ones this store touches."""
    try:
        return entry.is_dir(follow_symlinks=False) and _is_hex(entry.name)
    except OSError:
        return False


def _is_shard_folder(entry: os.DirEntry) -> bool:
    return len(entry.name) == 2 and _is_hex_folder(entry)


def _hash_of_block_file(name: str) -> bytes | None:
    hex_name = name.removesuffix(_BLOCK_SUFFIX)
    return None if hex_name == name else _hash_of_hex(hex_name)


def _hash_of_hex(text: str) -> bytes | None:
    if not _is_hex(text) or len(text) % 2:
        return None
    return bytes.fromhex(text)


def _is_block_or_temp_file(entry: os.DirEntry) -> bool:
    name = entry.name
    return name.endswith((_BLOCK_SUFFIX, _TEMP_SUFFIX)) and _is_hex(name.split(".", 1)[0])


def _remove_empty_folder(path: Path) -> None:
    try:
        path.rmdir()
    except OSError:
        pass  # not empty (someone else's files) or already gone
