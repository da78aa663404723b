"""The disk tier under the prefix cache (issue 16): full blocks are saved as they enter the
prefix cache, and a prompt whose prefix the memory cache lacks finds the next blocks on disk.

Blocks are named by the same chained hashes as in memory (engine.core.block_pool), under a
fingerprint of everything that makes their keys and values: the model's weights (sampled from
their files), dtype, quantization, kernels, block size and KV layout. A block of another model,
or made another way, is never found. What is saved is copied out of the cache on the engine
thread and written by a background thread (engine.disk_cache.writer). What is loaded is read
ahead on background threads from when the prompt is added (engine.disk_cache.read_ahead) and
verified (checksum and token ids) by the store (engine.disk_cache.store); when the prompt is
scheduled, the engine thread takes it (or reads it, if no thread has yet) and writes it into free
blocks that then join the memory cache. The blocks a request with a cache tag found or saved are
listed under its tag, written with the next batch, so that deleting a chat can remove the blocks
only it used (engine.disk_cache.store.forget_tag).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from hashlib import blake2b
from pathlib import Path
from typing import TYPE_CHECKING

from engine.disk_cache.read_ahead import Block, ReadAhead
from engine.disk_cache.store import DiskBlockStore, DiskCacheStats
from engine.disk_cache.writer import DiskBlockWriter

if TYPE_CHECKING:
    from engine.disk_cache.block_io import KVBlockIO

logger = logging.getLogger(__name__)

FINGERPRINT_VERSION = 1
# Weight of the newest measurement in the running estimate of reading a block.
_SMOOTHING = 0.3
_SAMPLE_BYTES = 1 << 20  # read from the start, middle and end of each weight file
_WEIGHT_FILES = (".safetensors", ".bin", ".gguf", ".pt", ".json")


@dataclass(slots=True, frozen=True)
class BlockRef:
    """A full block of a sequence: where it is in the cache, its hash and its tokens."""

    block_id: int
    block_hash: bytes
    token_ids: tuple[int, ...]


class DiskPrefixCache:
    """Used only where it pays: reading a block must be faster than computing its tokens again.
    Both are measured as the engine runs (a GPU recomputes 2,000 tokens of an 8B model faster
    than it reads them from disk; a CPU is a hundred times slower at it): until both are known
    the tier is used, then it loads and saves only while reading is the faster. Reading is
    costed by what the engine thread spends in `load`: a block read ahead costs only its wait
    and its copy into the cache."""

    def __init__(self, store: DiskBlockStore, writer: DiskBlockWriter, io: KVBlockIO,
                 read_ahead: ReadAhead | None = None) -> None:
        self.store = store
        self.writer = writer
        self.io = io
        self.read_ahead = (read_ahead if read_ahead is not None
                           else ReadAhead(store, io.bytes_per_block))
        self.block_size = io.block_shape[2]
        self.read_s_per_block: float | None = None
        self.compute_s_per_token: float | None = None
        # Tag -> hashes of the blocks it used since the last batch (engine thread only).
        self._tagged: dict[str, dict[bytes, None]] = {}

    @property
    def pays(self) -> bool:
        """Whether reading a block is expected to be faster than recomputing it."""
        if self.read_s_per_block is None or self.compute_s_per_token is None:
            return True
        return self.read_s_per_block < self.compute_s_per_token * self.block_size

    def observe_prefill(self, num_tokens: int, seconds: float) -> None:
        """A step that computed `num_tokens` prompt tokens took `seconds`. The fastest such step
        is the estimate: a slow one says what else happened (a kernel compiled for a new shape,
        another program on the cores), not what the tokens cost."""
        if num_tokens > 0 and seconds > 0:
            per_token = seconds / num_tokens
            if self.compute_s_per_token is None or per_token < self.compute_s_per_token:
                self.compute_s_per_token = per_token

    def num_hits(self, block_hashes: Sequence[bytes]) -> int:
        """How many of these blocks, from the first, are on disk (an index lookup, no I/O); none
        while reading does not pay."""
        if not self.pays:
            return 0
        n = 0
        for block_hash in block_hashes:
            if not self.store.contains(block_hash):
                break
            n += 1
        return n

    def prefetch(self, blocks: Sequence[Block]) -> None:
        """Start reading these blocks (hash, token ids: those `num_hits` found, of a prompt
        just added) in the background, so that `load` finds them in memory."""
        self.read_ahead.prefetch(blocks)

    def discard(self, block_hashes: Sequence[bytes]) -> None:
        """What was read ahead for these blocks will not be loaded: free its memory."""
        self.read_ahead.discard(block_hashes)

    def load(self, blocks: Sequence[BlockRef]) -> int:
        """Read the blocks into their places in the cache, from the first until one cannot be
        read (missing, corrupt, another's tokens); returns how many were loaded."""
        began = time.perf_counter()
        payloads = []
        for block in blocks:
            payload = self.read_ahead.load(block.block_hash, block.token_ids)
            if payload is None or len(payload) != self.io.bytes_per_block:
                break
            payloads.append(payload)
        if payloads:
            self.io.copy_in([b.block_id for b in blocks[:len(payloads)]], payloads)
            self.read_s_per_block = _smoothed(self.read_s_per_block,
                                              (time.perf_counter() - began) / len(payloads))
        return len(payloads)

    def record(self, tag: str, block_hashes: Sequence[bytes]) -> None:
        """Requests tagged `tag` used these blocks; listed on disk with the next `save`."""
        self._tagged.setdefault(tag, {}).update(dict.fromkeys(block_hashes))

    def save(self, blocks: Sequence[BlockRef]) -> None:
        """Copy the blocks out now and have them written in the background (those already on
        disk are skipped), with the blocks each tag used since the last call."""
        new = [b for b in blocks if not self.store.contains(b.block_hash)] if self.pays else []
        tags, self._tagged = self._tagged, {}
        if not new and not tags:
            return
        payloads = self.io.copy_out([b.block_id for b in new]) if new else []
        self.writer.submit([(b.block_hash, b.token_ids, payload)
                            for b, payload in zip(new, payloads, strict=True)],
                           {tag: list(hashes) for tag, hashes in tags.items()})

    def flush(self, timeout: float | None = None) -> bool:
        """Wait until what is queued is on disk; False if `timeout` ran out first. Any thread."""
        return self.writer.flush(timeout)

    def stats(self) -> DiskCacheStats:
        return self.store.stats()

    def clear(self) -> None:
        """Forget every block on disk, every model's, and those still queued (privacy: the
        keys and values are derived from the chats)."""
        self.writer.clear()
        self.read_ahead.clear()

    def close(self, timeout: float = 10.0) -> None:
        """Write what is still queued, then stop the writer and the reads ahead."""
        self.writer.close(timeout)
        self.read_ahead.close(timeout)


def _smoothed(estimate: float | None, measured: float) -> float:
    return measured if estimate is None else (1 - _SMOOTHING) * estimate + _SMOOTHING * measured


def model_fingerprint(model_path: Path, settings: Mapping[str, object]) -> str:
    """A name for the keys and values a model computes: its weight files (their names, sizes and
    sampled contents: hashing gigabytes at every start would cost seconds) and `settings`
    (dtype, quantization, kernels, block size, KV layout)."""
    h = blake2b(digest_size=16)
    h.update(f"pagoda-kv-v{FINGERPRINT_VERSION}".encode())
    for name, value in sorted(settings.items()):
        h.update(f"{name}={value};".encode())
    for file in _weight_files(Path(model_path)):
        _sample_file(h, file)
    return h.hexdigest()


def open_disk_prefix_cache(folder: Path, capacity_bytes: int, fingerprint: str,
                           io: KVBlockIO) -> DiskPrefixCache | None:
    """The disk tier in `folder`, or None (logged) when the folder cannot be used."""
    try:
        store = DiskBlockStore(Path(folder), fingerprint, capacity_bytes)
    except OSError as error:
        logger.warning("The prefix cache stays in memory only: %s cannot be used (%s)",
                       folder, error)
        return None
    return DiskPrefixCache(store, DiskBlockWriter(store), io)


def _weight_files(path: Path) -> list[Path]:
    if path.is_file():
        return [path]
    if not path.is_dir():
        return []
    return sorted(p for p in path.iterdir() if p.is_file() and p.suffix in _WEIGHT_FILES)


def _sample_file(h, file: Path) -> None:
    size = file.stat().st_size
    h.update(f"{file.name}:{size};".encode())
    with open(file, "rb") as f:
        offsets = {0, max(0, size // 2 - _SAMPLE_BYTES // 2), max(0, size - _SAMPLE_BYTES)}
        for offset in sorted(offsets):
            f.seek(offset)
            h.update(f.read(_SAMPLE_BYTES))
