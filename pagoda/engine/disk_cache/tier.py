"""The disk tier under the prefix cache (issue 16): full blocks are saved as they enter the
prefix cache, and a prompt whose prefix the memory cache lacks finds the next blocks on disk.

Blocks are named by the same chained hashes as in memory (pagoda.engine.core.block_pool), under a
fingerprint of everything that makes their keys and values: the model's weights (sampled from
their files), dtype, quantization, kernels, block size and KV layout. A block of another model,
or made another way, is never found. What is saved is copied out of the cache on the engine
thread and written by a background thread (pagoda.engine.disk_cache.writer). What is loaded is read
ahead on background threads from when the prompt is added (pagoda.engine.disk_cache.read_ahead) and
verified (checksum and token ids) by the store (pagoda.engine.disk_cache.store); when the prompt is
scheduled, the engine thread takes it (or reads it, if no thread has yet) and writes it into free
blocks that then join the memory cache. The blocks a request with a cache tag found or saved are
listed under its tag, written with the next batch, so that deleting a chat can remove the blocks
only it used (pagoda.engine.disk_cache.store.forget_tag).

A model with several KV cache groups (Gemma 3: sliding-window layers beside global ones; see
pagoda.engine.core.kv_cache_manager) saves each group's part of a block in a file of its own, named by
`group_block_key`: the first group's under the block's hash, as a single-group model's whole
block, the others' under a hash of it and the group's number. Each part is saved while its group
still holds the block (a windowed group holds every block it computes until the block falls
behind its window), and a hit reads what a hit in memory takes: the first group's part of every
block, the other groups' parts of the blocks within their windows at the hit's end.

A model with recurrent layers (issue 56) saves its checkpoints too: every recurrent layer's
states at a block boundary, in a file named by `checkpoint_key` of the hash of the block ending
there, checked as a block's part is (the fingerprint, which names the states' shapes, the block's
token ids, the checksum, the size). A checkpoint is copied out when the prefix cache makes it
findable and written with the step's blocks; a hit reads the deepest one at or before the end of
the blocks found, into a checkpoint slot (pagoda.engine.core.kv_cache_manager). Files of
checkpoints and of blocks share the store's budget and its least-recently-used order.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from hashlib import blake2b
from pathlib import Path
from typing import Protocol

from pagoda.engine.disk_cache.read_ahead import Block, ReadAhead
from pagoda.engine.disk_cache.store import DiskBlockStore, DiskCacheStats
from pagoda.engine.disk_cache.writer import DiskBlockWriter

logger = logging.getLogger(__name__)

FINGERPRINT_VERSION = 1
# Weight of the newest measurement in the running estimate of reading a block.
_SMOOTHING = 0.3
_SAMPLE_BYTES = 1 << 20  # read from the start, middle and end of each weight file
_WEIGHT_FILES = (".safetensors", ".bin", ".gguf", ".pt", ".json")


class BlockIO(Protocol):
    """What the tier asks of a KV cache group's copies in and out (block_io.KVBlockIO's),
    named here because block_io holds tensors and the prefix cache's bookkeeping, which holds
    none, imports this module."""

    @property
    def block_shape(self) -> tuple[int, ...]: ...
    @property
    def bytes_per_block(self) -> int: ...
    def copy_out(self, block_ids: list[int]) -> list[memoryview]: ...
    def copy_in(self, block_ids: list[int], payloads: list[bytes | memoryview]) -> None: ...


class StateIO(Protocol):
    """What the tier asks of the recurrent layers' states (state_io.RecurrentStateIO's): one
    slot's states of every layer as bytes, out and in."""

    @property
    def bytes_per_slot(self) -> int: ...
    def copy_out(self, slots: list[int]) -> list[memoryview]: ...
    def copy_in(self, slots: list[int], payloads: list[bytes | memoryview]) -> None: ...


def group_block_key(block_hash: bytes, group: int) -> bytes:
    """The name on disk of KV cache group `group`'s part of a block: the block's own hash for
    the first group (so a single-group model's files keep their names), a hash of it and the
    group's number for the others."""
    if group == 0:
        return block_hash
    return blake2b(b"kv-group-%d:" % group + block_hash, digest_size=len(block_hash)).digest()


def checkpoint_key(block_hash: bytes) -> bytes:
    """The name on disk of the recurrent states' checkpoint at the end of this block."""
    return blake2b(b"recurrent-states:" + block_hash, digest_size=len(block_hash)).digest()


@dataclass(slots=True, frozen=True)
class CheckpointRef:
    """A checkpoint of the recurrent states: its slot, and the hash and tokens of the block
    that ends at its boundary."""

    slot: int
    block_hash: bytes
    token_ids: tuple[int, ...]


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
    and its copy into the cache. With several KV cache groups, by the first group's loads: every
    block of a hit reads its part, the others' parts are at most a window's per hit.

    io (read_ahead): the first KV cache group's; windowed_ios: each further group's, in the KV
    cache manager's order. `group` arguments count the same way (0: the first group).
    state_io: a model with recurrent layers' states, whose checkpoints are kept too."""

    def __init__(self, store: DiskBlockStore, writer: DiskBlockWriter, io: BlockIO,
                 read_ahead: ReadAhead | None = None,
                 windowed_ios: Sequence[BlockIO] = (), state_io: StateIO | None = None) -> None:
        self.store = store
        self.writer = writer
        self.ios = [io, *windowed_ios]
        self.read_aheads = [read_ahead if read_ahead is not None
                            else ReadAhead(store, io.bytes_per_block)]
        self.read_aheads += [ReadAhead(store, w.bytes_per_block) for w in windowed_ios]
        self.state_io = state_io
        self.state_read_ahead = (ReadAhead(store, state_io.bytes_per_slot)
                                 if state_io is not None else None)
        # Checkpoints copied out, written with the next `save` (engine thread only).
        self._checkpoints: list[tuple[bytes, tuple[int, ...], memoryview]] = []
        self.io = io
        self.read_ahead = self.read_aheads[0]
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

    def num_hits(self, block_hashes: Sequence[bytes], group: int = 0) -> int:
        """How many of these blocks, from the first, have their `group` part on disk (an index
        lookup, no I/O); none while reading does not pay."""
        n = 0
        for found in self.on_disk(block_hashes, group):
            if not found:
                break
            n += 1
        return n

    def on_disk(self, block_hashes: Sequence[bytes], group: int) -> list[bool]:
        """Per block, whether its `group` part is on disk (index lookups, no I/O); none while
        reading does not pay."""
        if not self.pays:
            return [False] * len(block_hashes)
        return [self.store.contains(group_block_key(h, group)) for h in block_hashes]

    def prefetch(self, blocks: Sequence[Block], group: int = 0) -> None:
        """Start reading these blocks' `group` parts (hash, token ids: blocks found on disk, of
        a prompt just added) in the background, so that `load` finds them in memory."""
        self.read_aheads[group].prefetch([(group_block_key(h, group), tokens)
                                          for h, tokens in blocks])

    def discard(self, block_hashes: Sequence[bytes]) -> None:
        """What was read ahead for these blocks (any group's part, the checkpoint at their
        end) will not be loaded: free its memory."""
        for group, read_ahead in enumerate(self.read_aheads):
            # Lazily: a read-ahead holding nothing returns before deriving any name.
            read_ahead.discard(group_block_key(h, group) for h in block_hashes)
        if self.state_read_ahead is not None:
            self.state_read_ahead.discard(checkpoint_key(h) for h in block_hashes)

    def checkpoints_on_disk(self, block_hashes: Sequence[bytes]) -> list[bool]:
        """Per block, whether the checkpoint at its end is on disk (index lookups, no I/O);
        none while reading does not pay, or for a model without recurrent layers."""
        if self.state_io is None or not self.pays:
            return [False] * len(block_hashes)
        return [self.store.contains(checkpoint_key(h)) for h in block_hashes]

    def prefetch_checkpoint(self, block_hash: bytes, token_ids: tuple[int, ...]) -> None:
        """Start reading the checkpoint at the end of this block in the background."""
        if self.state_read_ahead is not None:
            self.state_read_ahead.prefetch([(checkpoint_key(block_hash), token_ids)])

    def load_checkpoint(self, ref: CheckpointRef) -> bool:
        """Read the checkpoint at the end of ref's block into its slot; False (the slot
        untouched) when it cannot be read: missing, or refused by the store (another model's,
        other tokens, a damaged file) or for its size."""
        if self.state_io is None:
            return False
        payload = self.state_read_ahead.load(checkpoint_key(ref.block_hash), ref.token_ids)
        if payload is None or len(payload) != self.state_io.bytes_per_slot:
            return False
        self.state_io.copy_in([ref.slot], [payload])
        return True

    def save_checkpoint(self, ref: CheckpointRef) -> None:
        """Copy the checkpoint in ref's slot out now (the slot may be reused the next step),
        to be written with the next `save`'s blocks, unless it is on disk already."""
        if self.state_io is None or not self.pays:
            return
        key = checkpoint_key(ref.block_hash)
        if not self.store.contains(key):
            payload, = self.state_io.copy_out([ref.slot])
            self._checkpoints.append((key, ref.token_ids, payload))

    def load(self, blocks: Sequence[BlockRef], group: int = 0) -> int:
        """Read the blocks' `group` parts into their places in that group's cache, from the
        first until one cannot be read (missing, corrupt, another's tokens or size); returns
        how many were loaded."""
        began = time.perf_counter()
        io, read_ahead = self.ios[group], self.read_aheads[group]
        payloads = []
        for block in blocks:
            payload = read_ahead.load(group_block_key(block.block_hash, group), block.token_ids)
            if payload is None or len(payload) != io.bytes_per_block:
                break
            payloads.append(payload)
        if payloads:
            io.copy_in([b.block_id for b in blocks[:len(payloads)]], payloads)
            if group == 0:
                self.read_s_per_block = _smoothed(self.read_s_per_block,
                                                  (time.perf_counter() - began) / len(payloads))
        return len(payloads)

    def record(self, tag: str, block_hashes: Sequence[bytes]) -> None:
        """Requests tagged `tag` used these blocks; listed on disk with the next `save`."""
        self._tagged.setdefault(tag, {}).update(dict.fromkeys(block_hashes))

    def save(self, blocks_by_group: Sequence[Sequence[BlockRef]]) -> None:
        """Copy the blocks out now (per KV cache group, the blocks it holds) and have them
        written in the background (parts already on disk are skipped), then the checkpoints
        copied out since the last call, with the blocks each tag used since the last call
        (every group's part of them and the checkpoints at their ends)."""
        written = []
        for group, blocks in enumerate(blocks_by_group if self.pays else ()):
            keys = [group_block_key(b.block_hash, group) for b in blocks]
            new = [(key, b) for key, b in zip(keys, blocks, strict=True)
                   if not self.store.contains(key)]
            if new:
                payloads = self.ios[group].copy_out([b.block_id for _, b in new])
                written += [(key, b.token_ids, payload)
                            for (key, b), payload in zip(new, payloads, strict=True)]
        written += self._checkpoints
        self._checkpoints = []
        tags, self._tagged = self._tagged, {}
        if not written and not tags:
            return
        self.writer.submit(written, {tag: [key for h in hashes for key in self._keys(h)]
                                     for tag, hashes in tags.items()})

    def _keys(self, block_hash: bytes) -> list[bytes]:
        """The names on disk of everything saved for a block: each group's part, and the
        checkpoint at its end."""
        keys = [group_block_key(block_hash, g) for g in range(len(self.ios))]
        if self.state_io is not None:
            keys.append(checkpoint_key(block_hash))
        return keys

    def flush(self, timeout: float | None = None) -> bool:
        """Wait until what is queued is on disk; False if `timeout` ran out first. Any thread."""
        return self.writer.flush(timeout)

    def stats(self) -> DiskCacheStats:
        return self.store.stats()

    def clear(self) -> None:
        """Forget every block on disk, every model's, and those still queued (privacy: the
        keys and values are derived from the chats)."""
        self._checkpoints = []
        self.writer.clear()
        for read_ahead in self._all_read_aheads():
            read_ahead.clear()

    def close(self, timeout: float = 10.0) -> None:
        """Write what is still queued (checkpoints copied out since the last `save`
        included), then stop the writer and the reads ahead."""
        if self._checkpoints:
            self.save([[] for _ in self.ios])
        self.writer.close(timeout)
        for read_ahead in self._all_read_aheads():
            read_ahead.close(timeout)

    def _all_read_aheads(self) -> list[ReadAhead]:
        extra = [self.state_read_ahead] if self.state_read_ahead is not None else []
        return [*self.read_aheads, *extra]


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
                           ios: Sequence[BlockIO],
                           state_io: StateIO | None = None) -> DiskPrefixCache | None:
    """The disk tier in `folder` for the KV cache groups whose blocks `ios` copy (the first
    group's first) and the recurrent states' checkpoints that `state_io` copies, if any, or
    None (logged) when the folder cannot be used."""
    try:
        store = DiskBlockStore(Path(folder), fingerprint, capacity_bytes)
    except OSError as error:
        logger.warning("The prefix cache stays in memory only: %s cannot be used (%s)",
                       folder, error)
        return None
    return DiskPrefixCache(store, DiskBlockWriter(store), ios[0], windowed_ios=ios[1:],
                           state_io=state_io)


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
