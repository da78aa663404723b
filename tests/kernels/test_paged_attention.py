"""The torch paged attention matches plain causal attention over each sequence's own keys,
with its scores capped where a softcap is given (as Gemma 2's eager attention in transformers)."""

import types

import pytest
import torch
from transformers.models.gemma2.modeling_gemma2 import eager_attention_forward

from pagoda.kernels.attention_metadata import AttentionMetadata, DecodeGroup, PrefillSegment
from pagoda.kernels.kernel_ops import TORCH_OPS as ops

BLOCK_SIZE = 4
NUM_BLOCKS = 32
HEADS, KV_HEADS, HEAD_DIM = 4, 2, 8


def reference_attention(q, keys, values, first_pos):
    """q [n, H, D] at positions first_pos.., keys/values [ctx, KV, D]; causal, GQA by repeat."""
    group = HEADS // KV_HEADS
    k = keys.repeat_interleave(group, dim=1).transpose(0, 1)
    v = values.repeat_interleave(group, dim=1).transpose(0, 1)
    scores = q.transpose(0, 1) @ k.transpose(1, 2) * HEAD_DIM ** -0.5
    q_pos = torch.arange(first_pos, first_pos + q.shape[0]).unsqueeze(1)
    scores = scores.masked_fill(torch.arange(keys.shape[0]).unsqueeze(0) > q_pos, float("-inf"))
    return (scores.softmax(-1) @ v).transpose(0, 1).reshape(q.shape[0], -1)


def capped_reference_attention(q, keys, values, first_pos, softcap):
    """reference_attention with its scores capped, by transformers' Gemma 2 eager attention."""
    module = types.SimpleNamespace(num_key_value_groups=HEADS // KV_HEADS, training=False)
    q_pos = torch.arange(first_pos, first_pos + q.shape[0]).unsqueeze(1)
    hidden = torch.arange(keys.shape[0]).unsqueeze(0) > q_pos
    additive = torch.zeros(hidden.shape).masked_fill(hidden, float("-inf"))
    out, _ = eager_attention_forward(module, q.transpose(0, 1)[None], keys.transpose(0, 1)[None],
                                     values.transpose(0, 1)[None], additive[None, None],
                                     scaling=HEAD_DIM ** -0.5, softcap=softcap)
    return out[0].reshape(q.shape[0], -1)


def _mixed_step(seed: int):
    """Two decode groups, a prefill that continues a cached prefix and a fresh one, in one
    step: (q, k, v, caches, metadata) and each sequence's (cached, new, all keys, all values)."""
    torch.manual_seed(seed)
    k_cache = torch.zeros(NUM_BLOCKS, BLOCK_SIZE, KV_HEADS, HEAD_DIM)
    v_cache = torch.zeros_like(k_cache)
    perm = torch.randperm(NUM_BLOCKS).tolist()
    # (tokens already cached, tokens computed this step): two decode groups, a prefill that
    # continues a cached prefix and a fresh one.
    shapes = [(13, 1), (11, 1), (3, 1), (6, 5), (0, 7)]
    tables, full_k, full_v = [], [], []
    for cached, new in shapes:
        n_blocks = -(-(cached + new) // BLOCK_SIZE)
        tables.append([perm.pop() for _ in range(n_blocks)])
        full_k.append(torch.randn(cached + new, KV_HEADS, HEAD_DIM))
        full_v.append(torch.randn(cached + new, KV_HEADS, HEAD_DIM))

    def slot(i, p):
        return tables[i][p // BLOCK_SIZE] * BLOCK_SIZE + p % BLOCK_SIZE

    for i, (cached, _) in enumerate(shapes):  # earlier steps wrote the cached prefix
        for p in range(cached):
            s = slot(i, p)
            k_cache.view(-1, KV_HEADS, HEAD_DIM)[s] = full_k[i][p]
            v_cache.view(-1, KV_HEADS, HEAD_DIM)[s] = full_v[i][p]

    q = torch.randn(sum(n for _, n in shapes), HEADS, HEAD_DIM)
    new_k = torch.cat([full_k[i][c:] for i, (c, _) in enumerate(shapes)])
    new_v = torch.cat([full_v[i][c:] for i, (c, _) in enumerate(shapes)])
    slots = torch.tensor([slot(i, p) for i, (c, n) in enumerate(shapes) for p in range(c, c + n)])

    def decode_group(start, end):
        lens = [shapes[i][0] + 1 for i in range(start, end)]
        width = -(-max(lens) // BLOCK_SIZE)
        table = torch.tensor([tables[i] + [0] * (width - len(tables[i])) for i in range(start, end)])
        mask = torch.arange(width * BLOCK_SIZE).unsqueeze(0) < torch.tensor(lens).unsqueeze(1)
        return DecodeGroup(start, end, table, mask.view(end - start, 1, 1, -1), torch.tensor(lens))

    prefix_mask = torch.arange(11).unsqueeze(0) <= torch.arange(6, 11).unsqueeze(1)
    meta = AttentionMetadata(
        slot_mapping=slots,
        decode_groups=[decode_group(0, 2), decode_group(2, 3)],
        prefills=[PrefillSegment(3, 8, 11, torch.tensor(tables[3]), prefix_mask),
                  PrefillSegment(8, 15, 7, torch.tensor(tables[4]), None)],
    )
    sequences = [(cached, n, full_k[i], full_v[i]) for i, (cached, n) in enumerate(shapes)]
    return (q, new_k, new_v, k_cache, v_cache, meta), sequences


def _each_sequence(sequences):
    """Each sequence's rows of the step, with its cached count, keys and values."""
    start = 0
    for cached, n, keys, values in sequences:
        yield slice(start, start + n), cached, keys, values
        start += n


def test_mixed_decodes_and_prefills_match_per_sequence_attention():
    step, sequences = _mixed_step(seed=0)
    q = step[0]
    out = ops.paged_attention(*step, HEAD_DIM ** -0.5)
    for rows, cached, keys, values in _each_sequence(sequences):
        expected = reference_attention(q[rows], keys, values, cached)
        torch.testing.assert_close(out[rows], expected, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("softcap", [1.0, 3.0])
def test_softcapped_scores_match_gemma2s_eager_attention_in_decodes_and_prefills(softcap):
    step, sequences = _mixed_step(seed=1)
    q = step[0] * 4  # scores well past the cap
    out = ops.paged_attention(q, *step[1:], HEAD_DIM ** -0.5, softcap=softcap)
    for rows, cached, keys, values in _each_sequence(sequences):
        expected = capped_reference_attention(q[rows], keys, values, cached, softcap)
        torch.testing.assert_close(out[rows], expected, atol=1e-5, rtol=1e-5)
        uncapped = reference_attention(q[rows], keys, values, cached)
        assert (out[rows] - uncapped).abs().max() > 0.1


def test_new_keys_and_values_land_in_their_slots():
    k_cache = torch.zeros(4, BLOCK_SIZE, KV_HEADS, HEAD_DIM)
    v_cache = torch.zeros_like(k_cache)
    k = torch.randn(3, KV_HEADS, HEAD_DIM)
    v = torch.randn(3, KV_HEADS, HEAD_DIM)
    ops.write_kv_cache(k, v, k_cache, v_cache, torch.tensor([5, 0, 15]))
    assert torch.equal(k_cache[1, 1], k[0]) and torch.equal(v_cache[3, 3], v[2])
    assert torch.equal(k_cache[0, 0], k[1])
    assert k_cache.abs().sum() == k.abs().sum()
