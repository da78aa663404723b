"""Pooling requests in the scheduler's bookkeeping: read in chunks, never sampled, finished with
"stop" once the whole prompt is read; no prefix-cache hits taken and none left behind."""

from pagoda.engine.config import SchedulerConfig
from pagoda.engine.core.kv_cache_manager import KVCacheManager
from pagoda.engine.core.scheduler import Scheduler
from pagoda.engine.core.sequence import Sequence
from pagoda.engine.sampling.params import PoolingParams, SamplingParams
from pagoda.engine.spec_decode.ngram_proposer import NgramProposer

BLOCK_SIZE = 4
PROMPT = list(range(10, 20))  # two full blocks and two tokens


def make_scheduler(budget: int = 4) -> Scheduler:
    kv = KVCacheManager(16, BLOCK_SIZE, enable_prefix_caching=True)
    return Scheduler(SchedulerConfig(4, budget, max_model_len=64), kv)


def pooling(request_id: str = "pool") -> Sequence:
    return Sequence(request_id, list(PROMPT), SamplingParams(), frozenset({0}),
                    pooling=PoolingParams())


def step(sched: Scheduler) -> list:
    out = sched.schedule()
    sched.update_from_output(out, [[1] if item.samples else [] for item in out.scheduled])
    return out.scheduled


def test_a_pooling_request_is_read_in_chunks_never_sampled_and_ends_with_stop():
    sched = make_scheduler(budget=4)
    seq = pooling()
    sched.add(seq)
    chunks = []
    while not seq.is_finished:
        (item,) = step(sched)
        assert not item.samples
        chunks.append(item.num_new_tokens)
    assert chunks == [4, 4, 2]
    assert seq.finish_reason == "stop" and seq.output_token_ids == []
    assert sched.take_finished() == [seq]
    assert sched.kv_cache.pool.num_free_blocks == 16


def test_a_pooling_request_takes_no_prefix_hit_and_caches_nothing():
    sched = make_scheduler(budget=64)
    reply = Sequence("reply", list(PROMPT), SamplingParams(max_tokens=1), frozenset({0}))
    sched.add(reply)
    while not reply.is_finished:
        step(sched)
    cached = sched.kv_cache.stats().num_cached_blocks
    assert cached == 2
    seq = pooling()
    sched.add(seq)
    (item,) = step(sched)
    assert item.num_computed_tokens == 0 and item.num_new_tokens == len(PROMPT)
    assert seq.is_finished and seq.num_cached_tokens == 0
    assert sched.kv_cache.stats().num_cached_blocks == cached


def test_a_pooling_requests_last_token_is_never_given_drafts():
    """Its last chunk is one token, shaped like a decode whose repeating history the n-gram
    proposer would continue; a pooling request has nothing to continue."""
    kv = KVCacheManager(16, BLOCK_SIZE, enable_prefix_caching=True)
    sched = Scheduler(SchedulerConfig(4, 6, max_model_len=64), kv, NgramProposer(3, 1, 3))
    seq = Sequence("pool", [5, 6, 5, 6, 5, 6, 5], SamplingParams(), frozenset({0}),
                   pooling=PoolingParams())
    sched.add(seq)
    step(sched)
    (last,) = step(sched)
    assert last.num_new_tokens == 1
    assert last.spec_token_ids == [] and seq.is_finished
