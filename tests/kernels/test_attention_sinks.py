"""Attention sinks (gpt-oss): a learned logit per query head joins each softmax's denominator
and weighs no value. Every backend gives transformers' gpt-oss eager attention: torch's paged
attention in decodes and prefill chunks, the C decode kernel (its scalar, AVX2 and AVX-512
bodies, and keys split across threads) and the Triton kernels (one pass and split decodes)."""

import types

import pytest
import torch
from kernel_device import DEVICE, assert_close
from test_decode_ops import ISAS, _decode_metadata, _filled_caches, _step_qkv, lib, ops  # noqa: F401
from test_paged_attention import HEAD_DIM, HEADS, KV_HEADS, _each_sequence, _mixed_step
from test_triton_attention import GQA, MIXED_BATCH, make_batch
from transformers.models.gpt_oss.modeling_gpt_oss import eager_attention_forward

from pagoda.kernels import torch_ref, triton_attention
from pagoda.kernels.cpu import decode_ops


def _sinks(heads: int, seed: int) -> torch.Tensor:
    """Sinks about as large as the scores, so that they take a real share of each softmax."""
    return 1.5 * torch.randn(heads, generator=torch.Generator().manual_seed(seed))


def gpt_oss_attention(q, keys, values, first_pos, sinks):
    """q [n, H, D] at positions first_pos.., keys/values [ctx, KV, D], causal: transformers'
    gpt-oss eager attention, the reference."""
    heads, kv_heads = q.shape[1], keys.shape[1]
    module = types.SimpleNamespace(num_key_value_groups=heads // kv_heads, training=False,
                                   sinks=sinks)
    q_pos = torch.arange(first_pos, first_pos + q.shape[0]).unsqueeze(1)
    hidden = torch.arange(keys.shape[0]).unsqueeze(0) > q_pos
    additive = torch.zeros(hidden.shape).masked_fill(hidden, float("-inf"))
    out, _ = eager_attention_forward(module, q.transpose(0, 1)[None], keys.transpose(0, 1)[None],
                                     values.transpose(0, 1)[None], additive[None, None],
                                     scaling=q.shape[-1] ** -0.5)
    return out[0].reshape(q.shape[0], -1)


def test_torch_paged_attention_with_sinks_is_gpt_oss_eager_attention():
    step, sequences = _mixed_step(seed=2)
    sinks = _sinks(HEADS, seed=2)
    with_sinks = torch_ref.paged_attention(*step, HEAD_DIM ** -0.5, sinks=sinks)
    without = torch_ref.paged_attention(*step, HEAD_DIM ** -0.5)
    q = step[0]
    for rows, cached, keys, values in _each_sequence(sequences):
        expected = gpt_oss_attention(q[rows], keys, values, cached, sinks)
        torch.testing.assert_close(with_sinks[rows], expected, atol=1e-5, rtol=1e-5)
    assert (with_sinks - without).abs().max() > 0.1


def _c_and_torch(lib_or_ops, context_lens, kv_heads, seed):
    torch.manual_seed(seed)
    meta = _decode_metadata(context_lens, block_size=16, num_blocks=100)
    q, k, v = _step_qkv(len(context_lens), HEADS, kv_heads, 64)
    caches = _filled_caches(100, 16, kv_heads, 64, torch.float32)
    sinks = _sinks(HEADS, seed)
    got = lib_or_ops.paged_attention(q, k, v, caches[0].clone(), caches[1].clone(), meta,
                                     0.125, sinks=sinks)
    meta.decode_workspace = None
    want = torch_ref.paged_attention(q, k, v, caches[0].clone(), caches[1].clone(), meta, 0.125,
                                     sinks=sinks)
    meta.decode_workspace = None
    plain = lib_or_ops.paged_attention(q, k, v, *caches, meta, 0.125)
    return got, want, plain


@ISAS
def test_c_decode_attention_with_sinks_is_torchs(ops):  # noqa: F811
    got, want, plain = _c_and_torch(ops, [100, 33, 1], KV_HEADS, seed=3)
    torch.testing.assert_close(got, want, atol=2e-5, rtol=1e-4)
    assert (got - plain).abs().max() > 0.1


def test_c_decode_attention_adds_the_sink_once_when_keys_split_across_threads(lib, monkeypatch):  # noqa: F811
    """One kv head and two threads: each sequence's keys are attended in two parts."""
    monkeypatch.setattr(decode_ops, "PARALLEL_MIN_SCORES", 0)
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        got, want, _ = _c_and_torch(lib, [900, 300], 1, seed=4)
    finally:
        torch.set_num_threads(threads)
    torch.testing.assert_close(got, want, atol=2e-5, rtol=1e-4)


@pytest.mark.parametrize("num_kv_splits", [1, 4])
def test_triton_attention_with_sinks_in_prefill_chunks_and_split_decodes(num_kv_splits):
    heads, kv_heads = GQA[3]
    shapes = [(50, 1), (10, 1), (3, 1)] if num_kv_splits > 1 else MIXED_BATCH
    batch = make_batch(shapes, heads, kv_heads, 64, 16, torch.float32, num_kv_splits)
    sinks = _sinks(heads, seed=5).to(DEVICE)
    ref_caches = batch.k_cache.clone(), batch.v_cache.clone()
    scale = 64 ** -0.5
    out = triton_attention.paged_attention(batch.q, batch.k, batch.v, batch.k_cache,
                                           batch.v_cache, batch.meta, scale, sinks=sinks)
    reference = torch_ref.varlen_paged_attention(batch.q, batch.k, batch.v, *ref_caches,
                                                 batch.meta, scale, sinks=sinks)
    assert_close(out, reference)
    assert (out - batch.expected).abs().max() > 0.1  # the plain attention, without sinks
