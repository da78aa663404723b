"""The Triton norm, rotary, activation and cache-write kernels match their torch references."""

import pytest
import torch
from kernel_device import DEVICE, KERNEL_DTYPES, assert_close

from pagoda.kernels import torch_ref, triton_layers

EPS = 1e-5


def randn(*shape, dtype=torch.float32):
    return torch.randn(*shape, device=DEVICE).to(dtype)


@pytest.mark.parametrize("dtype", KERNEL_DTYPES)
@pytest.mark.parametrize("hidden", [64, 576])  # 576 is not a power of two (SmolLM2)
def test_rms_norm_matches_reference(dtype, hidden):
    x, w = randn(7, hidden, dtype=dtype), randn(hidden, dtype=dtype)
    assert_close(triton_layers.rms_norm(x, w, EPS), torch_ref.rms_norm(x, w, EPS))


@pytest.mark.parametrize("dtype", KERNEL_DTYPES)
def test_add_rms_norm_returns_the_sum_as_new_residual(dtype):
    x, residual, w = randn(5, 576, dtype=dtype), randn(5, 576, dtype=dtype), randn(576, dtype=dtype)
    normed, new_residual = triton_layers.add_rms_norm(x.clone(), residual, w, EPS)
    ref_normed, ref_residual = torch_ref.add_rms_norm(x.clone(), residual, w, EPS)
    assert_close(new_residual, ref_residual)
    assert_close(normed, ref_normed)


@pytest.mark.parametrize("dtype", KERNEL_DTYPES)
@pytest.mark.parametrize("head_dim", [64, 128])
def test_rotary_embedding_on_a_strided_slice_of_fused_qkv(dtype, head_dim):
    heads, kv_heads, tokens = 3, 1, 6
    qkv = randn(tokens, heads + 2 * kv_heads, head_dim, dtype=dtype)
    q_and_k = qkv[:, :heads + kv_heads]  # token stride spans v too, as in the model
    cos, sin = randn(tokens, 1, head_dim, dtype=dtype), randn(tokens, 1, head_dim, dtype=dtype)
    assert_close(triton_layers.rotary_embedding(q_and_k, cos, sin),
                 torch_ref.rotary_embedding(q_and_k, cos, sin))


@pytest.mark.parametrize("dtype", KERNEL_DTYPES)
@pytest.mark.parametrize("intermediate", [128, 1536])
def test_silu_and_mul_matches_reference(dtype, intermediate):
    x = randn(4, 2 * intermediate, dtype=dtype)
    assert_close(triton_layers.silu_and_mul(x), torch_ref.silu_and_mul(x))


@pytest.mark.parametrize("dtype", KERNEL_DTYPES)
@pytest.mark.parametrize("intermediate", [128, 2048])  # Gemma 3 270M's is 2048
def test_gelu_tanh_and_mul_matches_reference(dtype, intermediate):
    x = 3 * randn(4, 2 * intermediate, dtype=dtype)  # out to where tanh saturates
    assert_close(triton_layers.gelu_tanh_and_mul(x), torch_ref.gelu_tanh_and_mul(x))


@pytest.mark.parametrize("dtype", KERNEL_DTYPES)
def test_write_kv_cache_lands_in_slots_and_skips_padding(dtype):
    num_blocks, block_size, kv_heads, head_dim = 4, 16, 2, 64
    k_cache = torch.zeros(num_blocks, block_size, kv_heads, head_dim, device=DEVICE, dtype=dtype)
    v_cache = torch.zeros_like(k_cache)
    qkv = randn(4, 3 * kv_heads, head_dim, dtype=dtype)
    k, v = qkv[:, kv_heads:2 * kv_heads], qkv[:, 2 * kv_heads:]
    slots = torch.tensor([17, 0, -1, 63], device=DEVICE)
    triton_layers.write_kv_cache(k, v, k_cache, v_cache, slots)
    ref_k, ref_v = torch.zeros_like(k_cache), torch.zeros_like(v_cache)
    keep = slots >= 0
    torch_ref.write_kv_cache(k[keep], v[keep], ref_k, ref_v, slots[keep])
    assert torch.equal(k_cache, ref_k) and torch.equal(v_cache, ref_v)
