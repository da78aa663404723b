"""The Triton recurrent state updates equal their torch references
(pagoda/kernels/recurrent_steps.py) and touch only the slots they are given."""

import pytest
import torch
import torch.nn.functional as F
from kernel_device import DEVICE

from pagoda.kernels import recurrent_steps, triton_recurrent

SLOTS = 4


def randn(*shape):
    return torch.randn(*shape, device=DEVICE)


@pytest.mark.parametrize("tiled", [False, True], ids=["grouped", "tiled"])
@pytest.mark.parametrize(("batch", "k_heads", "v_heads", "k_dim", "v_dim"),
                         [(1, 1, 1, 8, 8), (3, 2, 4, 16, 40), (2, 1, 3, 24, 8)])
def test_gdn_step_matches_torch(batch, k_heads, v_heads, k_dim, v_dim, tiled):
    state = randn(SLOTS, v_heads, k_dim, v_dim)
    q = F.normalize(randn(batch, k_heads, k_dim), dim=-1) * k_dim ** -0.5
    k = F.normalize(randn(batch, k_heads, k_dim), dim=-1)
    v, g = randn(batch, v_heads, v_dim), -torch.rand(batch, v_heads, device=DEVICE)
    beta = torch.rand(batch, v_heads, device=DEVICE)
    slots = torch.tensor([3, 0, 2][:batch], device=DEVICE)
    want_state = state.clone()
    want = recurrent_steps.gdn_step(want_state, slots, q, k, v, g, beta, tiled)
    got = triton_recurrent.gdn_step(state, slots, q, k, v, g, beta, tiled)
    torch.testing.assert_close(got, want, rtol=2e-5, atol=2e-5)
    torch.testing.assert_close(state, want_state, rtol=2e-5, atol=2e-5)


@pytest.mark.parametrize("with_d", [True, False])
@pytest.mark.parametrize(("batch", "heads", "head_dim", "groups", "state_size"),
                         [(1, 1, 4, 1, 8), (3, 4, 20, 2, 12), (2, 2, 16, 1, 32)])
def test_mamba2_step_matches_torch(batch, heads, head_dim, groups, state_size, with_d):
    state = randn(SLOTS, heads, head_dim, state_size)
    x, dt = randn(batch, heads, head_dim), F.softplus(randn(batch, heads))
    a, d = -torch.rand(heads, device=DEVICE) * 4, randn(heads) if with_d else None
    b, c = randn(batch, groups, state_size), randn(batch, groups, state_size)
    slots = torch.tensor([1, 3, 0][:batch], device=DEVICE)
    want_state = state.clone()
    want = recurrent_steps.mamba2_step(want_state, slots, x, dt, a, b, c, d)
    got = triton_recurrent.mamba2_step(state, slots, x, dt, a, b, c, d)
    torch.testing.assert_close(got, want, rtol=2e-5, atol=2e-5)
    torch.testing.assert_close(state, want_state, rtol=2e-5, atol=2e-5)
