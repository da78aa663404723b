"""Mamba-2's scan: a run prefilled in chunks of any size, carrying the state between them, gives
what one token at a time gives, and so do the states it hands back at given offsets."""

import math

import pytest
import torch

from pagoda.engine.layers.ssd import SsmParams, ssd_prefill, ssd_step

HEADS, HEAD_DIM, STATE, GROUPS, CHUNK, LENGTH = 4, 3, 5, 2, 4, 11


def params(dtype, chunk=CHUNK, dt_min=0.0, dt_max=math.inf):
    g = torch.Generator().manual_seed(1)
    return SsmParams(A=-torch.exp(torch.rand(HEADS, generator=g) * 2).to(torch.float32),
                     D=torch.randn(HEADS, generator=g, dtype=dtype),
                     dt_bias=torch.randn(HEADS, generator=g, dtype=dtype),
                     n_groups=GROUPS, chunk_size=chunk, dt_min=dt_min, dt_max=dt_max)


def inputs(dtype, length=LENGTH):
    g = torch.Generator().manual_seed(0)
    return (torch.randn(length, HEADS, HEAD_DIM, generator=g, dtype=dtype),
            torch.randn(length, HEADS, generator=g, dtype=dtype),
            torch.randn(length, GROUPS, STATE, generator=g, dtype=dtype),
            torch.randn(length, GROUPS, STATE, generator=g, dtype=dtype))


def one_token_at_a_time(x, dt, B, C, p, initial):
    """Outputs and the state after every token (index k: after k tokens), slot 1 of 3."""
    states = torch.zeros(3, HEADS, HEAD_DIM, STATE, dtype=initial.dtype)
    states[1] = initial
    slot = torch.tensor([1])
    ys, after = [], [initial.clone()]
    for t in range(x.shape[0]):
        ys.append(ssd_step(x[t:t + 1], dt[t:t + 1], B[t:t + 1], C[t:t + 1], p, states, slot)[0])
        after.append(states[1].clone())
    assert (states[[0, 2]] == 0).all()
    return torch.stack(ys), after


def naive(x, dt, B, C, p, state):
    """The recurrence written out per head, in float64: the definition both forms implement."""
    x, B, C, state = x.double(), B.double(), C.double(), state.double().clone()
    step = torch.nn.functional.softplus(dt.double() + p.dt_bias.double()).clamp(p.dt_min, p.dt_max)
    per_group = HEADS // GROUPS
    ys = torch.zeros_like(x)
    for t in range(x.shape[0]):
        for h in range(HEADS):
            b, c = B[t, h // per_group], C[t, h // per_group]
            state[h] = (torch.exp(step[t, h] * p.A[h].double()) * state[h]
                        + step[t, h] * torch.outer(x[t, h], b))
            ys[t, h] = state[h] @ c + p.D[h].double() * x[t, h]
    return ys, state


@pytest.mark.parametrize("dtype, tol", [(torch.float64, 1e-12), (torch.float32, 1e-5)])
def test_prefill_in_chunks_of_every_size_equals_one_token_at_a_time(dtype, tol):
    x, dt, B, C = inputs(dtype)
    p = params(dtype)
    initial = torch.randn(HEADS, HEAD_DIM, STATE, dtype=dtype)
    want_y, want_states = one_token_at_a_time(x, dt, B, C, p, initial)
    for size in range(1, LENGTH + 1):
        state, ys = initial, []
        for start in range(0, LENGTH, size):
            end = start + size
            run = ssd_prefill(x[start:end], dt[start:end], B[start:end], C[start:end], p, state)
            ys.append(run.y)
            state = run.final_state
        torch.testing.assert_close(torch.cat(ys), want_y, rtol=tol, atol=tol)
        torch.testing.assert_close(state, want_states[-1], rtol=tol, atol=tol)


@pytest.mark.parametrize("dt_limits", [(0.0, math.inf), (0.3, 0.9)])
def test_both_forms_are_the_recurrence(dt_limits):
    x, dt, B, C = inputs(torch.float64)
    p = params(torch.float64, dt_min=dt_limits[0], dt_max=dt_limits[1])
    initial = torch.randn(HEADS, HEAD_DIM, STATE, dtype=torch.float64)
    want_y, want_state = naive(x, dt, B, C, p, initial)
    run = ssd_prefill(x, dt, B, C, p, initial)
    torch.testing.assert_close(run.y, want_y)
    torch.testing.assert_close(run.final_state, want_state)
    steps_y, steps_states = one_token_at_a_time(x, dt, B, C, p, initial)
    torch.testing.assert_close(steps_y, want_y)
    torch.testing.assert_close(steps_states[-1], want_state)


def test_fresh_run_starts_from_zeros():
    x, dt, B, C = inputs(torch.float64)
    p = params(torch.float64)
    zeros = torch.zeros(HEADS, HEAD_DIM, STATE, dtype=torch.float64)
    fresh = ssd_prefill(x, dt, B, C, p, None)
    continued = ssd_prefill(x, dt, B, C, p, zeros)
    torch.testing.assert_close(fresh.y, continued.y)
    torch.testing.assert_close(fresh.final_state, continued.final_state)


def test_states_at_offsets_are_the_states_after_that_many_tokens():
    x, dt, B, C = inputs(torch.float64)
    p = params(torch.float64)
    initial = torch.randn(HEADS, HEAD_DIM, STATE, dtype=torch.float64)
    _, want = one_token_at_a_time(x, dt, B, C, p, initial)
    offsets = (LENGTH, 0, 3, CHUNK, CHUNK + 1, 2 * CHUNK, LENGTH - 1)
    run = ssd_prefill(x, dt, B, C, p, initial, states_at=offsets)
    assert len(run.states_at) == len(offsets)
    for offset, state in zip(offsets, run.states_at):
        torch.testing.assert_close(state, want[offset], msg=f"state after {offset} tokens")


def test_states_at_refuses_an_offset_outside_the_run():
    x, dt, B, C = inputs(torch.float64)
    with pytest.raises(ValueError, match="outside the run"):
        ssd_prefill(x, dt, B, C, params(torch.float64), None, states_at=(LENGTH + 1,))


def test_fp32_state_under_bf16_activations_tracks_the_fp64_recurrence():
    x, dt, B, C = (t.to(torch.bfloat16) for t in inputs(torch.float64, length=40))
    p = params(torch.float32, chunk=16)
    run = ssd_prefill(x, dt, B, C, p, None)
    assert run.final_state.dtype == torch.float32 and run.y.dtype == torch.float32
    want_y, want_state = naive(x, dt, B, C, p, torch.zeros(HEADS, HEAD_DIM, STATE))
    torch.testing.assert_close(run.final_state.double(), want_state, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(run.y.double(), want_y, rtol=1e-5, atol=1e-5)
