"""The pool of KV cache blocks: reference counts, the prefix-cache map and LRU eviction."""

from __future__ import annotations

from array import array
from collections import OrderedDict
from dataclasses import dataclass
from hashlib import blake2b

# Hashes must be stable across processes (blocks will be saved to disk and found again), so
# never Python's hash().
_HASH_BYTES = 16


def hash_block_tokens(parent_hash: bytes | None, token_ids: list[int] | tuple[int, ...],
                      extra: bytes = b"") -> bytes:
    """Chained hash of one full block: it depends on every token before it too. extra: what
    else the block holds that its tokens do not say (the images behind its placeholders)."""
    h = blake2b(digest_size=_HASH_BYTES)
    h.update(parent_hash or b"\0" * _HASH_BYTES)
    h.update(array("q", token_ids).tobytes())
    if extra:
        h.update(extra)
    return h.digest()


@dataclass(slots=True, eq=False)
class KVCacheBlock:
    block_id: int
    ref_cnt: int = 0
    block_hash: bytes | None = None
    # Kept so that a hash hit is confirmed by comparing tokens, not trusted blindly.
    token_ids: tuple[int, ...] | None = None


class BlockPool:
    """Owns every block. Free blocks wait in LRU order; cached ones stay findable until evicted."""

    def __init__(self, num_blocks: int) -> None:
        if num_blocks < 1:
            raise ValueError(f"num_blocks={num_blocks} must be >= 1")
        self.blocks = [KVCacheBlock(i) for i in range(num_blocks)]
        # Insertion order is eviction order: the front was freed longest ago.
        self._free: OrderedDict[int, KVCacheBlock] = OrderedDict((b.block_id, b) for b in self.blocks)
        self._cached: dict[bytes, KVCacheBlock] = {}

    @property
    def num_blocks(self) -> int:
        return len(self.blocks)

    @property
    def num_free_blocks(self) -> int:
        return len(self._free)

    @property
    def num_cached_blocks(self) -> int:
        return len(self._cached)

    def is_free(self, block: KVCacheBlock) -> bool:
        return block.ref_cnt == 0

    def lookup(self, block_hash: bytes, token_ids: tuple[int, ...]) -> KVCacheBlock | None:
        block = self._cached.get(block_hash)
        if block is None or block.token_ids != token_ids:
            return None
        return block

    def touch(self, blocks: list[KVCacheBlock]) -> None:
        """Take a reference on cache hits, pulling free ones out of the eviction queue."""
        for block in blocks:
            if block.ref_cnt == 0:
                del self._free[block.block_id]
            block.ref_cnt += 1

    def allocate(self, n: int) -> list[KVCacheBlock]:
        if n > len(self._free):
            raise RuntimeError(f"asked for {n} blocks with {len(self._free)} free")
        blocks = []
        for _ in range(n):
            _, block = self._free.popitem(last=False)
            self._evict(block)
            block.ref_cnt = 1
            blocks.append(block)
        return blocks

    def free(self, blocks: list[KVCacheBlock]) -> None:
        """Drop one reference each; the first block given becomes the first evicted."""
        for block in blocks:
            assert block.ref_cnt > 0, f"double free of block {block.block_id}"
            block.ref_cnt -= 1
            if block.ref_cnt == 0:
                self._free[block.block_id] = block

    def cache(self, block: KVCacheBlock, block_hash: bytes, token_ids: tuple[int, ...]) -> None:
        """Make a full, computed block findable by its hash (first writer wins)."""
        if block.block_hash is not None or block_hash in self._cached:
            return
        block.block_hash = block_hash
        block.token_ids = token_ids
        self._cached[block_hash] = block

    def _evict(self, block: KVCacheBlock) -> None:
        if block.block_hash is not None:
            del self._cached[block.block_hash]
            block.block_hash = None
            block.token_ids = None
