"""pagoda/kernels/cpu/recurrent_steps.c advances the recurrent layers' states one token, as the
torch versions (pagoda/kernels/recurrent_steps.py) do to fp32 rounding, and touches only the
slots it is given; the torch Gated DeltaNet step is transformers' recurrent rule."""

import pytest
import torch
import torch.nn.functional as F

from pagoda.kernels import recurrent_steps as ref
from pagoda.kernels.cpu.native import find_compiler
from pagoda.kernels.cpu.recurrent_steps import RecurrentSteps

SLOTS = 5


@pytest.fixture(scope="module")
def steps(kernel_build_dir) -> RecurrentSteps:
    if find_compiler() is None:
        pytest.skip("no C compiler (gcc or $CC) to build pagoda/kernels/cpu/recurrent_steps.c")
    return RecurrentSteps.load(kernel_build_dir)


def gdn_inputs(batch, k_heads, v_heads, k_dim, v_dim, seed=0):
    g = torch.Generator().manual_seed(seed)
    q = F.normalize(torch.randn(batch, k_heads, k_dim, generator=g), dim=-1) * k_dim ** -0.5
    k = F.normalize(torch.randn(batch, k_heads, k_dim, generator=g), dim=-1)
    v = torch.randn(batch, v_heads, v_dim, generator=g)
    decay = -torch.rand(batch, v_heads, generator=g)
    beta = torch.rand(batch, v_heads, generator=g)
    state = torch.randn(SLOTS, v_heads, k_dim, v_dim, generator=g)
    return state, q, k, v, decay, beta


@pytest.mark.parametrize("tiled", [False, True], ids=["grouped", "tiled"])
@pytest.mark.parametrize(("batch", "k_heads", "v_heads", "k_dim", "v_dim"),
                         [(1, 1, 1, 8, 8), (3, 2, 4, 16, 24), (2, 4, 4, 128, 128)])
def test_gdn_step_matches_torch_and_leaves_other_slots(steps, batch, k_heads, v_heads, k_dim,
                                                       v_dim, tiled):
    state, q, k, v, decay, beta = gdn_inputs(batch, k_heads, v_heads, k_dim, v_dim)
    slots = torch.tensor([4, 0, 2][:batch])
    want_state = state.clone()
    want = ref.gdn_step(want_state, slots, q, k, v, decay, beta, tiled)
    got = steps.gdn_step(state, slots, q, k, v, decay, beta, tiled)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(state, want_state, rtol=1e-5, atol=1e-5)


def test_gdn_torch_step_is_transformers_recurrent_rule():
    from transformers.models.qwen3_next.modeling_qwen3_next import (
        torch_recurrent_gated_delta_rule,
    )

    state, q, k, v, decay, beta = gdn_inputs(2, 2, 4, 16, 8)
    slots = torch.tensor([3, 1])
    initial = state[slots].clone()
    # transformers takes [batch, time, heads, dim], normalises and scales q and k itself.
    raw_q, raw_k = torch.randn(2, 1, 2, 16), torch.randn(2, 1, 2, 16)
    want, want_state = torch_recurrent_gated_delta_rule(
        raw_q, raw_k, v[:, None], decay[:, None], beta[:, None], initial_state=initial,
        output_final_state=True, use_qk_l2norm_in_kernel=True)
    q = F.normalize(raw_q[:, 0], dim=-1, eps=1e-6) * 16 ** -0.5
    k = F.normalize(raw_k[:, 0], dim=-1, eps=1e-6)
    got = ref.gdn_step(state, slots, q, k, v, decay, beta)
    torch.testing.assert_close(got, want[:, 0], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(state[slots], want_state, rtol=1e-5, atol=1e-5)


def mamba2_inputs(batch, heads, head_dim, groups, state_size, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(batch, heads, head_dim, generator=g)
    dt = F.softplus(torch.randn(batch, heads, generator=g))
    a = -torch.rand(heads, generator=g) * 4
    b = torch.randn(batch, groups, state_size, generator=g)
    c = torch.randn(batch, groups, state_size, generator=g)
    d = torch.randn(heads, generator=g)
    state = torch.randn(SLOTS, heads, head_dim, state_size, generator=g)
    return state, x, dt, a, b, c, d


@pytest.mark.parametrize("with_d", [True, False])
@pytest.mark.parametrize(("batch", "heads", "head_dim", "groups", "state_size"),
                         [(1, 1, 4, 1, 8), (3, 4, 16, 2, 32), (2, 8, 64, 1, 128)])
def test_mamba2_step_matches_torch_and_leaves_other_slots(steps, batch, heads, head_dim, groups,
                                                          state_size, with_d):
    state, x, dt, a, b, c, d = mamba2_inputs(batch, heads, head_dim, groups, state_size)
    d = d if with_d else None
    slots = torch.tensor([1, 4, 3][:batch])
    want_state = state.clone()
    want = ref.mamba2_step(want_state, slots, x, dt, a, b, c, d)
    got = steps.mamba2_step(state, slots, x, dt, a, b, c, d)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(state, want_state, rtol=1e-5, atol=1e-5)


def test_mamba2_torch_step_is_transformers_state_update():
    from transformers.models.granitemoehybrid.modeling_granitemoehybrid import (
        mamba2_selective_state_update,
    )

    state, x, dt, a, b, c, d = mamba2_inputs(2, 4, 8, 2, 16)
    slots = torch.tensor([0, 2])
    theirs = state[slots].clone()
    want = mamba2_selective_state_update(theirs, x, dt[..., None].expand(2, 4, 8),
                                         a[:, None, None].expand(4, 8, 16), b, c,
                                         d[:, None].expand(4, 8))
    got = ref.mamba2_step(state, slots, x, dt, a, b, c, d)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(state[slots], theirs, rtol=1e-5, atol=1e-5)


def test_a_slot_outside_the_table_is_refused_before_any_write(steps):
    state, q, k, v, decay, beta = gdn_inputs(2, 1, 1, 8, 8)
    before = state.clone()
    with pytest.raises(ValueError, match="outside the 5 state slots"):
        steps.gdn_step(state, torch.tensor([1, SLOTS]), q, k, v, decay, beta)
    assert torch.equal(state, before)


def test_tiled_heads_are_grouped_heads_in_llama_cpps_order():
    """llama.cpp's converter moves value head kh * per_key + r to r * k_heads + kh: the tiled
    step on the moved heads is the grouped step on the original ones, moved."""
    k_heads, per_key = 2, 3
    state, q, k, v, decay, beta = gdn_inputs(2, k_heads, k_heads * per_key, 8, 4)
    order = torch.arange(k_heads * per_key).reshape(k_heads, per_key).t().reshape(-1)
    slots = torch.tensor([1, 3])
    tiled_state = state[:, order].clone()
    grouped = ref.gdn_step(state, slots, q, k, v, decay, beta)
    tiled = ref.gdn_step(tiled_state, slots, q, k, v[:, order], decay[:, order],
                         beta[:, order], tiled=True)
    torch.testing.assert_close(tiled, grouped[:, order])
    torch.testing.assert_close(tiled_state, state[:, order])
