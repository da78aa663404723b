"""Which blocks each sequence holds, prefix-cache hits, and the counters about them."""

from __future__ import annotations

from dataclasses import dataclass

from engine.core.block_pool import BlockPool, KVCacheBlock, hash_block_tokens
from engine.core.sequence import Sequence
from engine.disk_cache.tier import BlockRef, DiskPrefixCache


@dataclass(slots=True, frozen=True)
class KVCacheStats:
    num_blocks: int
    num_free_blocks: int
    num_cached_blocks: int
    usage: float
    prefix_queried_tokens: int
    prefix_hit_tokens: int

    @property
    def prefix_hit_rate(self) -> float:
        return self.prefix_hit_tokens / self.prefix_queried_tokens if self.prefix_queried_tokens else 0.0


class KVCacheManager:
    """Bookkeeping on block ids: no tensors live here. With a disk tier (`disk`), blocks the
    memory cache lacks are looked up and loaded from disk (read ahead from when the sequence is
    added: `prefetch`), and full blocks are saved to it."""

    def __init__(self, num_blocks: int, block_size: int, enable_prefix_caching: bool = True,
                 disk: DiskPrefixCache | None = None) -> None:
        self.block_size = block_size
        self.enable_prefix_caching = enable_prefix_caching
        self.pool = BlockPool(num_blocks)
        self.disk = disk if enable_prefix_caching else None
        self._blocks: dict[str, list[KVCacheBlock]] = {}
        self._num_cached: dict[str, int] = {}
        self._queried_tokens = 0
        self._hit_tokens = 0
        self._to_save: list[BlockRef] = []

    def get_computed_blocks(self, seq: Sequence) -> list[KVCacheBlock]:
        """The longest cached prefix of a sequence that has computed nothing yet.

        At least one token is always left to compute, since sampling needs its logits; a
        request for prompt logprobs computes its whole prompt, whose logits it needs, and so
        does a pooling request, whose vector needs every token's hidden state.
        """
        if not self._looks_up_prefix(seq):
            return []
        self._update_block_hashes(seq)
        max_blocks = (seq.num_tokens - 1) // self.block_size
        hits = self._memory_hits(seq, max_blocks)
        if self.disk is not None:
            if len(hits) < max_blocks:
                hits += self._load_from_disk(seq, hits, max_blocks)
            self.disk.discard(seq.block_hashes[:max_blocks])  # what it read ahead and not taken
        return hits

    def prefetch(self, seq: Sequence) -> None:
        """Have the disk tier start reading the blocks of a new sequence's prompt that the
        memory cache lacks and the disk has, so that they are in host memory when it is
        scheduled."""
        if self.disk is None or not self._looks_up_prefix(seq):
            return
        self._update_block_hashes(seq)
        max_blocks = (seq.num_tokens - 1) // self.block_size
        start = len(self._memory_hits(seq, max_blocks))
        n = self.disk.num_hits(seq.block_hashes[start:max_blocks])
        self.disk.prefetch([(seq.block_hashes[i], self._block_tokens(seq, i))
                            for i in range(start, start + n)])

    def _looks_up_prefix(self, seq: Sequence) -> bool:
        """Whether the sequence may start from cached blocks (see get_computed_blocks)."""
        return (self.enable_prefix_caching and not seq.num_computed_tokens
                and not seq.is_pooling and seq.params.prompt_logprobs is None)

    def _memory_hits(self, seq: Sequence, max_blocks: int) -> list[KVCacheBlock]:
        hits = []
        for i in range(max_blocks):
            block = self.pool.lookup(seq.block_hashes[i], self._block_tokens(seq, i))
            if block is None:
                break
            hits.append(block)
        return hits

    def _load_from_disk(self, seq: Sequence, hits: list[KVCacheBlock],
                        max_blocks: int) -> list[KVCacheBlock]:
        """The blocks after the memory hits that the disk has, read into free blocks that join
        the memory cache (free and cached, as a finished sequence leaves them)."""
        start = len(hits)
        n = self.disk.num_hits(seq.block_hashes[start:max_blocks])
        if n == 0:
            return []
        self.pool.touch(hits)  # so that making room for the loaded blocks never evicts them
        blocks = self.pool.allocate(min(n, self.pool.num_free_blocks))
        num_loaded = 0
        try:
            refs = [BlockRef(b.block_id, seq.block_hashes[start + i],
                             self._block_tokens(seq, start + i)) for i, b in enumerate(blocks)]
            num_loaded = self.disk.load(refs)
            for block, ref in zip(blocks[:num_loaded], refs, strict=False):
                self.pool.cache(block, ref.block_hash, ref.token_ids)
        finally:
            # Unread blocks are reused first; the loaded ones tail first, as `free` does.
            self.pool.free(blocks[num_loaded:] + list(reversed(blocks[:num_loaded])))
            self.pool.free(hits)
        return blocks[:num_loaded]

    def record_prefix_query(self, num_tokens: int, num_hit_tokens: int) -> None:
        self._queried_tokens += num_tokens
        self._hit_tokens += num_hit_tokens

    def allocate_slots(self, seq: Sequence, num_new_tokens: int,
                       computed_blocks: list[KVCacheBlock] | tuple = ()) -> bool:
        """Reserve room for `num_new_tokens` more; False (and nothing changed) if it does not fit."""
        held = self._blocks.setdefault(seq.request_id, [])
        num_computed = seq.num_computed_tokens + len(computed_blocks) * self.block_size
        num_required = -(-(num_computed + num_new_tokens) // self.block_size)
        num_new_blocks = max(0, num_required - len(held) - len(computed_blocks))
        num_reviving = sum(1 for b in computed_blocks if self.pool.is_free(b))
        if num_new_blocks + num_reviving > self.pool.num_free_blocks:
            return False
        self.pool.touch(list(computed_blocks))
        held.extend(computed_blocks)
        held.extend(self.pool.allocate(num_new_blocks))
        seq.block_ids = [b.block_id for b in held]
        return True

    def cache_full_blocks(self, seq: Sequence) -> None:
        """Register the blocks that became full and computed, so later prompts can hit them.
        A pooling request's are not: it reads texts no chat continues (documents to index), and
        its blocks would only push a chat's out of the cache."""
        if not self.enable_prefix_caching or seq.is_pooling:
            return
        held = self._blocks.get(seq.request_id, [])
        num_full = min(seq.num_computed_tokens // self.block_size, len(held))
        start = self._num_cached.get(seq.request_id, 0)
        if num_full <= start:
            return
        self._update_block_hashes(seq)
        for i in range(start, num_full):
            self.pool.cache(held[i], seq.block_hashes[i], self._block_tokens(seq, i))
        self._num_cached[seq.request_id] = num_full
        if self.disk is not None:
            self._to_save += [BlockRef(held[i].block_id, seq.block_hashes[i],
                                       self._block_tokens(seq, i)) for i in range(start, num_full)]
            if seq.cache_tag is not None:
                # From the first block: prefix hits (memory or disk) are this chat's blocks too.
                self.disk.record(seq.cache_tag, seq.block_hashes[start:num_full])

    def save_to_disk(self) -> None:
        """Hand the blocks that became full this step to the disk tier (it copies them now and
        writes them in the background), and which blocks each cache tag used: call once per
        step, before any block is reused."""
        if self.disk is not None:
            blocks, self._to_save = self._to_save, []
            self.disk.save(blocks)

    def trim(self, seq: Sequence) -> None:
        """Release the blocks past the computed tokens: those that held rejected drafts."""
        held = self._blocks.get(seq.request_id, [])
        keep = -(-seq.num_computed_tokens // self.block_size)
        if len(held) <= keep:
            return
        released = held[keep:]
        del held[keep:]
        self.pool.free(list(reversed(released)))
        seq.block_ids = seq.block_ids[:keep]

    def free(self, seq: Sequence) -> None:
        """Release every block; tail blocks are evicted first, the shared prefix last."""
        if self.disk is not None:
            self.disk.discard(seq.block_hashes)  # an aborted prompt's reads ahead, if any
        held = self._blocks.pop(seq.request_id, [])
        self._num_cached.pop(seq.request_id, None)
        self.pool.free(list(reversed(held)))
        seq.block_ids = []

    def stats(self) -> KVCacheStats:
        n = self.pool.num_blocks
        free = self.pool.num_free_blocks
        return KVCacheStats(n, free, self.pool.num_cached_blocks, 1.0 - free / n,
                            self._queried_tokens, self._hit_tokens)

    def _block_tokens(self, seq: Sequence, i: int) -> tuple[int, ...]:
        return tuple(seq.all_token_ids[i * self.block_size:(i + 1) * self.block_size])

    def _update_block_hashes(self, seq: Sequence) -> None:
        hashes = seq.block_hashes
        for i in range(len(hashes), seq.num_tokens // self.block_size):
            parent = hashes[-1] if hashes else None
            hashes.append(hash_block_tokens(parent, self._block_tokens(seq, i)))
