"""KV cache groups: a sliding-window group holds only the blocks its window still sees, gives the
others back to its pool as a sequence advances, and a prefix hit needs only its window's blocks."""

from pagoda.engine.core.kv_cache_manager import KVCacheGroup, KVCacheManager
from pagoda.engine.core.sequence import NULL_BLOCK, Sequence
from pagoda.engine.sampling.params import SamplingParams

BLOCK_SIZE = 4
WINDOW = 8
# A full-attention group and a windowed one, as Gemma 3's global and local layers.
GROUPS = (KVCacheGroup(32, 0, 300), KVCacheGroup(32, WINDOW, 1500))


def _seq(request_id: str, num_tokens: int, first: int = 0) -> Sequence:
    return Sequence(request_id, list(range(first, first + num_tokens)),
                    SamplingParams(max_tokens=64), frozenset())


def _run(kv: KVCacheManager, seq: Sequence, chunk: int) -> list[int]:
    """Compute the whole sequence `chunk` tokens a step; the windowed pool's free count after
    each step's allocation."""
    free = []
    hit = kv.get_computed_blocks(seq)
    seq.num_computed_tokens = 0
    while seq.num_computed_tokens < seq.num_tokens:
        n = min(chunk, seq.num_tokens - seq.num_computed_tokens - (hit.num_tokens if hit else 0))
        assert kv.allocate_slots(seq, n, hit)
        seq.num_computed_tokens += n + (hit.num_tokens if hit else 0)
        hit = None
        kv.cache_full_blocks(seq)
        free.append(kv.pools[1].num_free_blocks)
    return free


def test_a_windowed_group_gives_back_the_blocks_behind_its_window():
    kv = KVCacheManager(GROUPS, BLOCK_SIZE)
    seq = _seq("a", 100)
    free = _run(kv, seq, chunk=1)
    full, windowed = seq.block_ids, seq.windowed_block_ids[0]
    assert len(full) == len(windowed) == 25 and NULL_BLOCK not in full
    # Token 99 sees keys 92..99: blocks 23 and 24; everything before is back in the pool.
    assert windowed[:23] == [NULL_BLOCK] * 23 and NULL_BLOCK not in windowed[23:]
    assert min(free) >= 32 - (-(-WINDOW // BLOCK_SIZE) + 1)
    assert kv.pools[0].num_free_blocks == 32 - 25
    kv.free(seq)
    assert [p.num_free_blocks for p in kv.pools] == [32, 32]


def test_held_bytes_count_each_group_at_its_own_block_size():
    kv = KVCacheManager(GROUPS, BLOCK_SIZE)
    seq = _seq("a", 100)
    _run(kv, seq, chunk=16)
    stats = kv.stats()
    # The last step's first token, 96, sees keys from 89 on: windowed blocks 22 to 24.
    assert stats.held_bytes == 25 * 300 + 3 * 1500
    assert stats.total_bytes == 32 * 300 + 32 * 1500


def test_a_prefix_hit_takes_only_the_window_blocks_of_a_windowed_group():
    kv = KVCacheManager(GROUPS, BLOCK_SIZE)
    first = _seq("a", 41)
    _run(kv, first, chunk=16)
    kept = first.windowed_block_ids[0]
    kv.free(first)
    second = _seq("b", 60)  # the same 41 tokens, then more
    hit = kv.get_computed_blocks(second)
    assert hit.num_tokens == 40
    # Position 40 attends keys 33..40: blocks 8 and 9, which the first sequence held last.
    assert hit.blocks[1][:8] == [None] * 8
    assert [b.block_id for b in hit.blocks[1][8:]] == kept[8:10]
    assert kv.allocate_slots(second, 20, hit)
    assert second.windowed_block_ids[0][:8] == [NULL_BLOCK] * 8


def test_a_hit_stops_where_the_windowed_group_lost_its_window():
    kv = KVCacheManager(GROUPS, BLOCK_SIZE)
    first = _seq("a", 41)
    _run(kv, first, chunk=16)
    kv.free(first)
    # Another prompt takes every free windowed block (the first's window blocks too), not the
    # full group's cached ones.
    other = _seq("c", 4 * 32, first=1000)
    _run(kv, other, chunk=4 * 32)
    kv.free(other)
    hit = kv.get_computed_blocks(_seq("b", 60))
    assert hit.num_tokens == 0 and hit.blocks == ([], [])


def test_a_step_that_does_not_fit_the_windowed_pool_changes_nothing_it_holds():
    kv = KVCacheManager((KVCacheGroup(32), KVCacheGroup(4, WINDOW)), BLOCK_SIZE)
    seq = _seq("a", 40)
    assert not kv.allocate_slots(seq, 20)  # 5 windowed blocks at once: more than the pool
    assert seq.block_ids == [] and [p.num_free_blocks for p in kv.pools] == [32, 4]
    assert kv.allocate_slots(seq, 8)
