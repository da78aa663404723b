"""Which blocks each sequence holds, prefix-cache hits, and the counters about them.

A model whose layers attend in different ways (Gemma 3: five sliding-window layers to one global)
keeps its layers in KV cache groups, one per kind, each with its own pool of blocks and its own
block table per sequence. A windowed group's table holds only the blocks its window can still
see: the blocks wholly behind it go back to its pool as the sequence advances (still findable by
the prefix cache until they are reused), and its table says NULL_BLOCK in their place.

With a disk tier, each group saves its part of every full block it holds and a hit loads what a
hit in memory would take: the first group's blocks and each windowed group's within its window
at the hit's end (pagoda.engine.disk_cache.tier). On a model with recurrent layers the
checkpoints of their states are saved as they become findable, and a hit reads blocks from disk
only up to the deepest boundary with a checkpoint in memory or on disk, whose states it reads
into a checkpoint slot when memory lacks them.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from pagoda.engine.core.block_pool import BlockPool, KVCacheBlock, hash_block_tokens
from pagoda.engine.core.checkpoint_store import Checkpoint, CheckpointStore
from pagoda.engine.core.image_spans import block_extra, hit_end
from pagoda.engine.core.sequence import NULL_BLOCK, Sequence
from pagoda.engine.disk_cache.tier import BlockRef, CheckpointRef, DiskPrefixCache


@dataclass(slots=True, frozen=True)
class KVCacheGroup:
    """Layers sharing one pool and one block table per sequence. window: a block wholly more
    than this many tokens behind the next token to compute is released (0 keeps every block).
    bytes_per_block: what one block of the group holds over all of its layers."""

    num_blocks: int
    window: int = 0
    bytes_per_block: int = 1

    def first_needed_block(self, num_computed: int, block_size: int) -> int:
        """The first block whose keys the token at position num_computed still attends."""
        if not self.window:
            return 0
        return max(0, num_computed - self.window + 1) // block_size


@dataclass(slots=True, frozen=True)
class PrefixHit:
    """A new sequence's cached prefix: num_tokens, and per group the blocks that hold it (None
    where a windowed group needs no block: behind the window at the prefix's end).
    checkpoint_slot: on a model with recurrent layers, the checkpoint of their states at the
    prefix's end, which the sequence's slot starts from."""

    num_tokens: int
    blocks: tuple[list[KVCacheBlock | None], ...]
    checkpoint_slot: int | None = None


@dataclass(slots=True, frozen=True)
class KVCacheStats:
    num_blocks: int
    num_free_blocks: int
    num_cached_blocks: int
    usage: float  # of the bytes of every group's pool, the share sequences hold
    prefix_queried_tokens: int
    prefix_hit_tokens: int
    held_bytes: int  # KV bytes that running sequences hold, over every group
    total_bytes: int

    @property
    def prefix_hit_rate(self) -> float:
        return self.prefix_hit_tokens / self.prefix_queried_tokens if self.prefix_queried_tokens else 0.0


class _GroupTables:
    """One group's pool and each sequence's table in it."""

    def __init__(self, spec: KVCacheGroup, block_size: int) -> None:
        self.spec = spec
        self.block_size = block_size
        self.pool = BlockPool(spec.num_blocks)
        self.tables: dict[str, list[KVCacheBlock | None]] = {}
        self.num_cached: dict[str, int] = {}
        # How far each table has been released behind its window (everything before is None).
        self.num_released: dict[str, int] = {}

    def release_behind_window(self, request_id: str, num_computed: int) -> None:
        held = self.tables.get(request_id)
        if not held or not self.spec.window:
            return
        start = self.num_released.get(request_id, 0)
        end = min(self.spec.first_needed_block(num_computed, self.block_size), len(held))
        if end <= start:
            return
        released = [b for b in held[start:end] if b is not None]
        held[start:end] = [None] * (end - start)
        self.num_released[request_id] = end
        # The newest first: eviction takes the oldest, the prefix least likely asked again.
        self.pool.free(released)

    def blocks_wanted(self, request_id: str, num_required: int,
                      hit: list[KVCacheBlock | None]) -> int:
        """Free blocks that growing the table to num_required with `hit` takes."""
        held = self.tables.get(request_id, [])
        num_new = max(0, num_required - len(held) - len(hit))
        return num_new + sum(1 for b in hit if b is not None and self.pool.is_free(b))

    def grow(self, request_id: str, num_required: int, hit: list[KVCacheBlock | None]) -> None:
        held = self.tables.setdefault(request_id, [])
        taken = [b for b in hit if b is not None]
        self.pool.touch(taken)
        if hit and self.spec.window:
            self.num_released[request_id] = len(hit) - len(taken)
        held.extend(hit)
        held.extend(self.pool.allocate(max(0, num_required - len(held))))

    def block_ids(self, request_id: str) -> list[int]:
        held = self.tables.get(request_id, [])
        if not self.spec.window:
            return [b.block_id for b in held]
        return [NULL_BLOCK if b is None else b.block_id for b in held]

    def trim(self, request_id: str, keep: int) -> None:
        held = self.tables.get(request_id, [])
        if len(held) <= keep:
            return
        released = [b for b in held[keep:] if b is not None]
        del held[keep:]
        self.pool.free(list(reversed(released)))

    def free(self, request_id: str) -> None:
        held = self.tables.pop(request_id, [])
        self.num_cached.pop(request_id, None)
        self.num_released.pop(request_id, None)
        self.pool.free([b for b in reversed(held) if b is not None])

    @property
    def held_bytes(self) -> int:
        return (self.pool.num_blocks - self.pool.num_free_blocks) * self.spec.bytes_per_block


class KVCacheManager:
    """Bookkeeping on block ids: no tensors live here. `groups`: the KV cache groups (the first
    keeps every block), or a number of blocks for a model whose layers all attend alike. With a
    disk tier (`disk`, holding each group's part of a block), blocks the memory cache lacks are
    looked up and loaded from disk (read ahead from when the sequence is added: `prefetch`),
    and full blocks are saved to it.

    recurrent: the model also has recurrent layers (LFM2's short convolutions), whose states
    a prefix hit must start from too: a hit ends at the deepest matched block boundary that
    has a checkpoint of them in `checkpoints` (or, with a disk tier, on disk). Without a store
    no sequence starts from cached blocks (every lookup finds 0 tokens) and none are
    registered."""

    def __init__(self, groups: int | tuple[KVCacheGroup, ...], block_size: int,
                 enable_prefix_caching: bool = True,
                 disk: DiskPrefixCache | None = None, recurrent: bool = False,
                 checkpoints: CheckpointStore | None = None) -> None:
        specs = (KVCacheGroup(groups),) if isinstance(groups, int) else tuple(groups)
        if not specs or specs[0].window:
            raise ValueError("the first KV cache group keeps every block (window 0)")
        if recurrent and disk is not None and (checkpoints is None or disk.state_io is None):
            raise ValueError("a model with recurrent layers keeps blocks on disk only with the "
                             "checkpoints of their states: give the disk tier the states "
                             "(state_io) and the KV cache a checkpoint store")
        if disk is not None and len(disk.ios) != len(specs):
            raise ValueError(f"the disk prefix cache keeps blocks of {len(disk.ios)} KV cache "
                             f"groups, the KV cache has {len(specs)}")
        if checkpoints is not None and not recurrent:
            raise ValueError("recurrent state checkpoints are for a model with recurrent layers")
        self.block_size = block_size
        self.enable_prefix_caching = enable_prefix_caching and (
            not recurrent or checkpoints is not None)
        self.checkpoints = checkpoints if self.enable_prefix_caching else None
        self._groups = [_GroupTables(spec, block_size) for spec in specs]
        self.pool = self._groups[0].pool
        self.disk = disk if enable_prefix_caching else None
        self._queried_tokens = 0
        self._hit_tokens = 0
        self._to_save: list[list[BlockRef]] = [[] for _ in specs]  # per group

    @property
    def pools(self) -> list[BlockPool]:
        """Each group's pool, the first group's (`pool`) first."""
        return [g.pool for g in self._groups]

    def get_computed_blocks(self, seq: Sequence) -> PrefixHit:
        """The longest cached prefix of a sequence that has computed nothing yet: the first
        group's blocks from the start, each windowed group's within its window at the end.

        At least one token is always left to compute, since sampling needs its logits; a
        request for prompt logprobs computes its whole prompt, whose logits it needs, and so
        does a pooling request, whose vector needs every token's hidden state.
        """
        if not self._looks_up_prefix(seq):
            return PrefixHit(0, tuple([] for _ in self._groups))
        self._update_block_hashes(seq)
        max_blocks = (seq.num_tokens - 1) // self.block_size
        if seq.images:  # never ending inside an image
            max_blocks = hit_end(seq.images, max_blocks * self.block_size,
                                 self.block_size) // self.block_size
        hits = self._memory_hits(seq, max_blocks)
        if self.disk is not None:
            end = self._disk_hit_end(seq, len(hits), max_blocks)
            if self.checkpoints is not None:
                end = self._checkpoint_end(seq, end)  # blocks past it would not be used
            if end > len(hits):
                hits += self._read_into_pool(seq, 0, range(len(hits), end), hits)
            self._load_windows_from_disk(seq, len(hits))
        if self.checkpoints is not None:
            hit = self._at_checkpoint(seq, hits)
        else:
            hit = self._within_windows(seq, hits)
        if self.disk is not None:
            self.disk.discard(seq.block_hashes[:max_blocks])  # what it read ahead and not taken
        return hit

    def _at_checkpoint(self, seq: Sequence, hits: list[KVCacheBlock]) -> PrefixHit:
        """The hit cut back to the deepest of its block boundaries with a checkpoint of the
        recurrent states, in memory or read from disk (and, there, every windowed group's
        window); none: 0 tokens."""
        on_disk = self._checkpoints_on_disk(seq, len(hits))
        for end in range(len(hits), 0, -1):
            block_hash = seq.block_hashes[end - 1]
            if self.checkpoints.find(block_hash) is None and not on_disk[end - 1]:
                continue
            hit = self._within_windows(seq, hits[:end])
            if hit.num_tokens != end * self.block_size:
                continue
            slot = self._checkpoint_slot(seq, end - 1)
            if slot is not None:
                return replace(hit, checkpoint_slot=slot)
        return PrefixHit(0, tuple([] for _ in self._groups))

    def _checkpoints_on_disk(self, seq: Sequence, num_blocks: int) -> list[bool]:
        """Per block of the first num_blocks, whether the checkpoint at its end is on disk."""
        if self.disk is None:
            return [False] * num_blocks
        return self.disk.checkpoints_on_disk(seq.block_hashes[:num_blocks])

    def _checkpoint_end(self, seq: Sequence, num_blocks: int) -> int:
        """The deepest block boundary within the first num_blocks blocks with a checkpoint in
        memory or on disk, in blocks (0: none)."""
        on_disk = self._checkpoints_on_disk(seq, num_blocks)
        for end in range(num_blocks, 0, -1):
            if on_disk[end - 1] or self.checkpoints.find(seq.block_hashes[end - 1]) is not None:
                return end
        return 0

    def _checkpoint_slot(self, seq: Sequence, index: int) -> int | None:
        """The slot of the checkpoint at the end of block `index`: the cached one (touched),
        else one read from disk into a slot that becomes cached; None when neither can be had
        (not on disk, a file the store refused, every slot held)."""
        block_hash = seq.block_hashes[index]
        slot = self.checkpoints.find(block_hash)
        if slot is not None:
            self.checkpoints.touch(block_hash)
            return slot
        slot = self.checkpoints.allocate() if self.disk is not None else None
        if slot is None:
            return None
        ref = CheckpointRef(slot, block_hash, self._block_tokens(seq, index))
        if not self.disk.load_checkpoint(ref):
            self.checkpoints.release(slot)
            return None
        self.checkpoints.commit(slot, block_hash)
        return slot

    def commit_checkpoint(self, seq: Sequence, checkpoint: Checkpoint) -> None:
        """Make a held checkpoint of the sequence's states findable by the hash of the block
        ending at its boundary; with a disk tier, have it saved too (copied out now)."""
        index = checkpoint.num_tokens // self.block_size - 1
        block_hash = self.block_hash(seq, index)
        if self.checkpoints.commit(checkpoint.slot, block_hash) and self.disk is not None:
            self.disk.save_checkpoint(CheckpointRef(checkpoint.slot, block_hash,
                                                    self._block_tokens(seq, index)))

    def block_hash(self, seq: Sequence, index: int) -> bytes:
        """The chained hash of the sequence's full block `index`."""
        self._update_block_hashes(seq)
        return seq.block_hashes[index]

    def _within_windows(self, seq: Sequence, hits: list[KVCacheBlock]) -> PrefixHit:
        """The hit cut back to where every windowed group also has its window's blocks."""
        windowed = self._groups[1:]
        found = [self._group_lookups(seq, g, len(hits)) for g in windowed]
        end = self._hit_end(len(hits), [[b is not None for b in blocks] for blocks in found])
        tables = [hits[:end]]
        for g, blocks in zip(windowed, found, strict=True):
            first = g.spec.first_needed_block(end * self.block_size, self.block_size)
            tables.append([None] * first + blocks[first:end])
        return PrefixHit(end * self.block_size, tuple(tables))

    def _hit_end(self, num_blocks: int, present: list[list[bool]]) -> int:
        """How many of the first num_blocks blocks a hit may take: the most at whose end every
        windowed group has the blocks its window needs (`present`, per windowed group and
        block)."""
        runs = [_runs(group_present) for group_present in present]
        end = num_blocks
        while end and not all(
                run[end - 1] >= end - g.spec.first_needed_block(end * self.block_size,
                                                                self.block_size)
                for g, run in zip(self._groups[1:], runs, strict=True)):
            end -= 1
        return end

    def _group_lookups(self, seq: Sequence, group: _GroupTables, end: int,
                       start: int = 0) -> list[KVCacheBlock | None]:
        """The group's cached blocks for the sequence's blocks start..end-1 (None: not cached)."""
        return [group.pool.lookup(seq.block_hashes[i], self._block_tokens(seq, i))
                for i in range(start, end)]

    def _disk_hit_end(self, seq: Sequence, num_memory_hits: int, max_blocks: int) -> int:
        """Where a hit could end once the disk's blocks are read: past the first group's memory
        hits by the blocks on disk after them, cut back to where every windowed group has its
        window's blocks in memory or on disk."""
        start = num_memory_hits
        return self._reachable_end(
            seq, start + self.disk.num_hits(seq.block_hashes[start:max_blocks]))

    def _reachable_end(self, seq: Sequence, num_blocks: int) -> int:
        """The most of the first num_blocks blocks at whose end every windowed group has its
        window's blocks in memory or on disk."""
        present = []
        for g, group in enumerate(self._groups[1:], 1):
            in_memory = [b is not None for b in self._group_lookups(seq, group, num_blocks)]
            missing = [i for i, found in enumerate(in_memory) if not found]
            on_disk = self.disk.on_disk([seq.block_hashes[i] for i in missing], g)
            for i, found in zip(missing, on_disk, strict=True):
                in_memory[i] = found
            present.append(in_memory)
        return self._hit_end(num_blocks, present)

    def _window_misses(self, seq: Sequence, end: int) -> list[tuple[int, list[int],
                                                                    list[KVCacheBlock]]]:
        """Per windowed group (its index), the blocks its window needs at `end` that its memory
        cache lacks, and those it has."""
        misses = []
        for g, group in enumerate(self._groups[1:], 1):
            first = group.spec.first_needed_block(end * self.block_size, self.block_size)
            found = self._group_lookups(seq, group, end, first)
            misses.append((g, [i for i, b in enumerate(found, first) if b is None],
                           [b for b in found if b is not None]))
        return misses

    def _load_windows_from_disk(self, seq: Sequence, num_blocks: int) -> None:
        """Read from disk the blocks each windowed group's window needs, and lacks, at the end
        of the longest hit within num_blocks that memory and disk allow; where one cannot be
        read (a damaged file, now forgotten; no room), again for the longest hit before it."""
        end = self._reachable_end(seq, num_blocks)
        while end:
            short = [len(self._read_into_pool(seq, g, missing, found)) < len(missing)
                     for g, missing, found in self._window_misses(seq, end) if missing]
            if not any(short):
                return
            end = self._reachable_end(seq, end - 1)

    def prefetch(self, seq: Sequence) -> None:
        """Have the disk tier start reading the blocks of a new sequence's prompt that the
        memory cache lacks and the disk has, so that they are in host memory when it is
        scheduled."""
        if self.disk is None or not self._looks_up_prefix(seq):
            return
        self._update_block_hashes(seq)
        max_blocks = (seq.num_tokens - 1) // self.block_size
        start = len(self._memory_hits(seq, max_blocks))
        end = self._disk_hit_end(seq, start, max_blocks)
        if self.checkpoints is not None:
            end = self._prefetch_checkpoint(seq, end)
        self.disk.prefetch([(seq.block_hashes[i], self._block_tokens(seq, i))
                            for i in range(start, end)])
        for g, missing, _ in self._window_misses(seq, end):
            on_disk = self.disk.on_disk([seq.block_hashes[i] for i in missing], g)
            self.disk.prefetch([(seq.block_hashes[i], self._block_tokens(seq, i))
                                for i, found in zip(missing, on_disk, strict=True) if found], g)

    def _prefetch_checkpoint(self, seq: Sequence, num_blocks: int) -> int:
        """Start reading the deepest checkpoint within the first num_blocks blocks if only the
        disk has it; returns its boundary, in blocks (where a hit would end)."""
        end = self._checkpoint_end(seq, num_blocks)
        if end and self.checkpoints.find(seq.block_hashes[end - 1]) is None:
            self.disk.prefetch_checkpoint(seq.block_hashes[end - 1],
                                          self._block_tokens(seq, end - 1))
        return end

    def _looks_up_prefix(self, seq: Sequence) -> bool:
        """Whether the sequence may start from cached blocks (see get_computed_blocks)."""
        return (self.enable_prefix_caching and not seq.num_computed_tokens
                and not seq.is_pooling and seq.params.prompt_logprobs is None
                and not seq.params.skip_reading_prefix_cache)

    def _memory_hits(self, seq: Sequence, max_blocks: int) -> list[KVCacheBlock]:
        hits = []
        for i in range(max_blocks):
            block = self.pool.lookup(seq.block_hashes[i], self._block_tokens(seq, i))
            if block is None:
                break
            hits.append(block)
        return hits

    def _read_into_pool(self, seq: Sequence, group: int, indices: range | list[int],
                        found: list[KVCacheBlock]) -> list[KVCacheBlock]:
        """The sequence's blocks at `indices` (in order) read from disk into free blocks of a
        group's pool, which join its memory cache (free and cached, as a finished sequence
        leaves them), until one cannot be read; `found`: blocks of that group already found,
        which making room must not evict."""
        pool = self._groups[group].pool
        pool.touch(found)
        blocks = pool.allocate(min(len(indices), pool.num_free_blocks))
        num_loaded = 0
        try:
            refs = [BlockRef(b.block_id, seq.block_hashes[i], self._block_tokens(seq, i))
                    for b, i in zip(blocks, indices, strict=False)]
            num_loaded = self.disk.load(refs, group)
            for block, ref in zip(blocks[:num_loaded], refs, strict=False):
                pool.cache(block, ref.block_hash, ref.token_ids)
        finally:
            # Unread blocks are reused first; the loaded ones tail first, as `free` does.
            pool.free(blocks[num_loaded:] + list(reversed(blocks[:num_loaded])))
            pool.free(found)
        return blocks[:num_loaded]

    def record_prefix_query(self, num_tokens: int, num_hit_tokens: int) -> None:
        self._queried_tokens += num_tokens
        self._hit_tokens += num_hit_tokens

    def allocate_slots(self, seq: Sequence, num_new_tokens: int,
                       computed: PrefixHit | None = None) -> bool:
        """Reserve room for `num_new_tokens` more (after the prefix hit `computed` of a new
        sequence); False (and nothing held changed) if it does not fit. Windowed groups first
        give back the blocks that the step's first token no longer sees."""
        num_computed = seq.num_computed_tokens + (computed.num_tokens if computed else 0)
        num_required = -(-(num_computed + num_new_tokens) // self.block_size)
        hits = computed.blocks if computed else tuple([] for _ in self._groups)
        for group in self._groups:
            group.release_behind_window(seq.request_id, num_computed)
        if any(g.blocks_wanted(seq.request_id, num_required, hit) > g.pool.num_free_blocks
               for g, hit in zip(self._groups, hits, strict=True)):
            return False
        for group, hit in zip(self._groups, hits, strict=True):
            group.grow(seq.request_id, num_required, hit)
        self._write_tables(seq)
        return True

    def cache_full_blocks(self, seq: Sequence) -> None:
        """Register the blocks that became full and computed, so later prompts can hit them.
        A pooling request's are not: it reads texts no chat continues (documents to index), and
        its blocks would only push a chat's out of the cache."""
        if not self.enable_prefix_caching or seq.is_pooling:
            return
        first = self._groups[0]
        rid = seq.request_id
        num_full = min(seq.num_computed_tokens // self.block_size, len(first.tables.get(rid, [])))
        start = first.num_cached.get(rid, 0)
        if num_full <= start:
            return
        self._update_block_hashes(seq)
        for group, to_save in zip(self._groups, self._to_save, strict=True):
            held = group.tables.get(rid, [])
            for i in range(group.num_cached.get(rid, 0), min(num_full, len(held))):
                if held[i] is not None:
                    group.pool.cache(held[i], seq.block_hashes[i], self._block_tokens(seq, i))
                    if self.disk is not None:
                        to_save.append(BlockRef(held[i].block_id, seq.block_hashes[i],
                                                self._block_tokens(seq, i)))
            group.num_cached[rid] = num_full
        if self.disk is not None and seq.cache_tag is not None:
            # From the first block: prefix hits (memory or disk) are this chat's blocks too.
            self.disk.record(seq.cache_tag, seq.block_hashes[start:num_full])

    def save_to_disk(self) -> None:
        """Hand the blocks that became full this step to the disk tier (it copies them now and
        writes them in the background), and which blocks each cache tag used: call once per
        step, before any block is reused."""
        if self.disk is not None:
            blocks, self._to_save = self._to_save, [[] for _ in self._groups]
            self.disk.save(blocks)

    def trim(self, seq: Sequence) -> None:
        """Release the blocks past the computed tokens: those that held rejected drafts."""
        keep = -(-seq.num_computed_tokens // self.block_size)
        for group in self._groups:
            group.trim(seq.request_id, keep)
        self._write_tables(seq)

    def free(self, seq: Sequence) -> None:
        """Release every block; tail blocks are evicted first, the shared prefix last."""
        if self.disk is not None:
            self.disk.discard(seq.block_hashes)  # an aborted prompt's reads ahead, if any
        for group in self._groups:
            group.free(seq.request_id)
        self._write_tables(seq)

    def stats(self) -> KVCacheStats:
        n = self.pool.num_blocks
        held = sum(g.held_bytes for g in self._groups)
        total = sum(g.pool.num_blocks * g.spec.bytes_per_block for g in self._groups)
        return KVCacheStats(n, self.pool.num_free_blocks, self.pool.num_cached_blocks,
                            held / total, self._queried_tokens, self._hit_tokens, held, total)

    def _write_tables(self, seq: Sequence) -> None:
        seq.block_ids = self._groups[0].block_ids(seq.request_id)
        seq.windowed_block_ids = [g.block_ids(seq.request_id) for g in self._groups[1:]]

    def _block_tokens(self, seq: Sequence, i: int) -> tuple[int, ...]:
        return tuple(seq.all_token_ids[i * self.block_size:(i + 1) * self.block_size])

    def _update_block_hashes(self, seq: Sequence) -> None:
        hashes, size = seq.block_hashes, self.block_size
        for i in range(len(hashes), seq.num_tokens // size):
            parent = hashes[-1] if hashes else None
            extra = block_extra(seq.images, i * size, (i + 1) * size) if seq.images else b""
            hashes.append(hash_block_tokens(parent, self._block_tokens(seq, i), extra))


def _runs(present: list[bool]) -> list[int]:
    """Per index, how many blocks in a row up to and including it are present."""
    runs, run = [], 0
    for found in present:
        run = run + 1 if found else 0
        runs.append(run)
    return runs
