"""Triton paged attention over block tables matches per-sequence causal attention.

Each case is a batch of (tokens already cached, tokens computed this step) per sequence: single
token decodes, prefill chunks continuing a cached prefix (starting mid-block or on a boundary),
and fresh prompts, with ragged lengths and blocks scattered through the pool.
"""

import itertools
from dataclasses import dataclass

import pytest
import torch
from kernel_device import DEVICE, assert_close

from pagoda.kernels import torch_ref, triton_attention
from pagoda.kernels.attention_metadata import TritonAttentionMetadata, choose_num_kv_splits

MIXED_BATCH = [(37, 1), (5, 1), (16, 1), (20, 11), (32, 16), (0, 9)]


@dataclass
class Batch:
    q: torch.Tensor
    k: torch.Tensor  # this step's keys and values, [tokens, kv_heads, head_dim]
    v: torch.Tensor
    k_cache: torch.Tensor
    v_cache: torch.Tensor
    meta: TritonAttentionMetadata
    expected: torch.Tensor  # plain causal attention over each sequence's own keys, fp32
    softcap: float | None = None


def make_batch(shapes, num_heads, num_kv_heads, head_dim, block_size, dtype, num_kv_splits=1,
               sliding_window=0, seed=0, softcap=None) -> Batch:
    gen = torch.Generator().manual_seed(seed)
    tables = _scatter_blocks(shapes, block_size, gen)
    num_blocks = sum(len(t) for t in tables) + 2
    k_cache = torch.zeros(num_blocks, block_size, num_kv_heads, head_dim, dtype=dtype)
    v_cache = torch.zeros_like(k_cache)
    full_k, full_v = ([torch.randn(c + n, num_kv_heads, head_dim, generator=gen).to(dtype)
                       for c, n in shapes] for _ in range(2))
    for i, (cached, _) in enumerate(shapes):  # earlier steps wrote the cached prefix
        for p in range(cached):
            k_cache[tables[i][p // block_size], p % block_size] = full_k[i][p]
            v_cache[tables[i][p // block_size], p % block_size] = full_v[i][p]
    q = torch.randn(sum(n for _, n in shapes), num_heads, head_dim, generator=gen).to(dtype)
    expected = torch.cat([
        _causal_attention(q_i, full_k[i], full_v[i], cached, sliding_window, softcap)
        for i, ((cached, _), q_i) in enumerate(zip(shapes, q.split([n for _, n in shapes])))])
    meta = _metadata(shapes, tables, block_size, num_kv_splits, sliding_window)
    new_k = torch.cat([full_k[i][c:] for i, (c, _) in enumerate(shapes)])
    new_v = torch.cat([full_v[i][c:] for i, (c, _) in enumerate(shapes)])
    return Batch(*(t.to(DEVICE) for t in (q, new_k, new_v, k_cache, v_cache)), meta,
                 expected.to(DEVICE), softcap)


def _scatter_blocks(shapes, block_size, gen) -> list[list[int]]:
    counts = [-(-(c + n) // block_size) for c, n in shapes]
    perm = (torch.randperm(sum(counts), generator=gen) + 1).tolist()  # block 0 stays unused
    return [[perm.pop() for _ in range(n)] for n in counts]


def _metadata(shapes, tables, block_size, num_kv_splits, sliding_window) -> TritonAttentionMetadata:
    slots = [tables[i][p // block_size] * block_size + p % block_size
             for i, (c, n) in enumerate(shapes) for p in range(c, c + n)]
    width = max(len(t) for t in tables)
    starts = [0]
    for _, n in shapes:
        starts.append(starts[-1] + n)

    def ints(values, dtype=torch.int32):
        return torch.tensor(values, dtype=dtype, device=DEVICE)

    seq_lens = [c + n for c, n in shapes]
    return TritonAttentionMetadata(
        slot_mapping=ints(slots, torch.long), query_start_loc=ints(starts),
        seq_lens=ints(seq_lens), block_tables=ints([t + [0] * (width - len(t)) for t in tables]),
        max_query_len=max(n for _, n in shapes), max_seq_len=max(seq_lens),
        num_kv_splits=num_kv_splits, sliding_window=sliding_window)


def _causal_attention(q, keys, values, first_pos, sliding_window, softcap=None):
    """q [n, H, D] at positions first_pos.., keys/values [ctx, KV, D]; GQA by repeat, fp32;
    the scores capped at softcap * tanh(scores / softcap) where softcap is given."""
    group = q.shape[1] // keys.shape[1]
    k = keys.float().repeat_interleave(group, dim=1).transpose(0, 1)
    v = values.float().repeat_interleave(group, dim=1).transpose(0, 1)
    scores = q.float().transpose(0, 1) @ k.transpose(1, 2) * q.shape[-1] ** -0.5
    if softcap is not None:
        scores = softcap * torch.tanh(scores / softcap)
    q_pos = torch.arange(first_pos, first_pos + q.shape[0]).unsqueeze(1)
    k_pos = torch.arange(keys.shape[0]).unsqueeze(0)
    hidden = k_pos > q_pos
    if sliding_window:
        hidden |= k_pos <= q_pos - sliding_window
    scores = scores.masked_fill(hidden, float("-inf"))
    return (scores.softmax(-1) @ v).transpose(0, 1).reshape(q.shape[0], -1)


def run_and_check(batch: Batch) -> None:
    ref_k_cache, ref_v_cache = batch.k_cache.clone(), batch.v_cache.clone()
    scale = batch.q.shape[-1] ** -0.5
    out = triton_attention.paged_attention(batch.q, batch.k, batch.v, batch.k_cache,
                                           batch.v_cache, batch.meta, scale,
                                           softcap=batch.softcap)
    reference = torch_ref.varlen_paged_attention(batch.q, batch.k, batch.v, ref_k_cache,
                                                 ref_v_cache, batch.meta, scale,
                                                 softcap=batch.softcap)
    assert_close(out, batch.expected.to(out.dtype))
    assert_close(out, reference)
    assert torch.equal(batch.k_cache, ref_k_cache) and torch.equal(batch.v_cache, ref_v_cache)


# (query heads, kv heads): GQA ratios 1, 3 (SmolLM2) and 8 (Llama 3).
GQA = {1: (2, 2), 3: (6, 2), 8: (8, 1)}
CASES = list(itertools.product(GQA, [64, 128], [16, 32], [torch.float32, torch.float16]))


@pytest.mark.parametrize("gqa,head_dim,block_size,dtype", CASES)
def test_mixed_batch_of_decodes_and_prefill_chunks(gqa, head_dim, block_size, dtype):
    heads, kv_heads = GQA[gqa]
    run_and_check(make_batch(MIXED_BATCH, heads, kv_heads, head_dim, block_size, dtype))


@pytest.mark.skipif(DEVICE.type != "cuda", reason="bf16 is wrong under the Triton interpreter")
@pytest.mark.parametrize("gqa", [3, 8])
def test_mixed_batch_in_bf16(gqa):
    heads, kv_heads = GQA[gqa]
    run_and_check(make_batch(MIXED_BATCH, heads, kv_heads, 128, 16, torch.bfloat16))


@pytest.mark.parametrize("num_kv_splits", [1, 4, 8])
@pytest.mark.parametrize("gqa,dtype", [(3, torch.float32), (8, torch.float16)])
def test_split_kv_decode_matches_one_pass(num_kv_splits, gqa, dtype):
    heads, kv_heads = GQA[gqa]
    # More splits than some sequences have blocks: empty splits must not disturb the merge.
    shapes = [(100, 1), (3, 1), (31, 1), (64, 1)]
    run_and_check(make_batch(shapes, heads, kv_heads, 64, 16, dtype, num_kv_splits))


@pytest.mark.parametrize("num_kv_splits", [1, 4])
def test_sliding_window_masks_old_keys(num_kv_splits):
    heads, kv_heads = GQA[3]
    shapes = [(50, 1), (10, 1)] if num_kv_splits > 1 else MIXED_BATCH
    run_and_check(make_batch(shapes, heads, kv_heads, 64, 16, torch.float32, num_kv_splits,
                             sliding_window=24))


@pytest.mark.parametrize("num_kv_splits", [1, 4])
def test_softcapped_scores_in_prefill_chunks_and_split_decodes(num_kv_splits):
    """A cap of 0.5 bends the scores of these random heads (about 1 apart) a lot."""
    heads, kv_heads = GQA[3]
    shapes = [(50, 1), (10, 1)] if num_kv_splits > 1 else MIXED_BATCH
    capped = make_batch(shapes, heads, kv_heads, 64, 16, torch.float32, num_kv_splits,
                        softcap=0.5)
    uncapped = make_batch(shapes, heads, kv_heads, 64, 16, torch.float32, num_kv_splits)
    assert (capped.expected - uncapped.expected).abs().max() > 0.1
    run_and_check(capped)


def test_long_prefill_chunk_spans_several_query_blocks():
    heads, kv_heads = GQA[1]
    run_and_check(make_batch([(7, 70), (0, 33)], heads, kv_heads, 64, 16, torch.float32))


def test_num_kv_splits_grows_with_context_and_shrinks_with_batch():
    assert choose_num_kv_splits(1, 8, 100, 132) == 1
    assert choose_num_kv_splits(1, 8, 8192, 132) == 32
    assert choose_num_kv_splits(64, 8, 8192, 132) == 1
    assert choose_num_kv_splits(4, 8, 4096, 132) == 16
