"""The gated delta rule: a run prefilled in any chunks, with any internal chunk size, gives what
one token at a time gives, and its checkpoints are the states at those tokens."""

import pytest
import torch
import torch.nn.functional as F

from pagoda.engine.layers.gated_delta_rule import chunked_gated_delta_rule
from pagoda.kernels.recurrent_steps import gdn_step

LENGTH, HEADS, K_DIM, V_DIM = 23, 3, 4, 5
INTERNAL_CHUNK = 8  # small, so that a run spans several chunks and ends inside one


def make_inputs(dtype=torch.float64, seed=0, length=LENGTH):
    g = torch.Generator().manual_seed(seed)
    q = F.normalize(torch.randn(length, HEADS, K_DIM, generator=g), dim=-1) * K_DIM ** -0.5
    k = F.normalize(torch.randn(length, HEADS, K_DIM, generator=g), dim=-1)
    v = torch.randn(length, HEADS, V_DIM, generator=g)
    log_decay = -F.softplus(torch.randn(length, HEADS, generator=g))
    beta = torch.rand(length, HEADS, generator=g)
    state = torch.randn(HEADS, K_DIM, V_DIM, generator=g)
    return [t.to(dtype) for t in (q, k, v, log_decay, beta)], state.to(dtype)


def one_token_at_a_time(inputs, state):
    """Outputs and the state after every token count 0..T, by the step on slot 2 of 4."""
    states = torch.zeros(4, HEADS, K_DIM, V_DIM, dtype=state.dtype)
    states[2] = state
    slots = torch.tensor([2])
    outputs, after = [], [state.clone()]
    for t in range(inputs[0].shape[0]):
        outputs.append(gdn_step(states, slots, *(x[t:t + 1] for x in inputs))[0])
        after.append(states[2].clone())
    return torch.stack(outputs), after


def test_step_follows_the_delta_rule_definition():
    (q, k, v, g, beta), state = make_inputs()
    want = state.clone()
    for t in range(3):
        want = want * g[t].exp()[:, None, None]
        recalled = torch.einsum("hkv,hk->hv", want, k[t])
        want = want + torch.einsum("hk,hv->hkv", k[t], beta[t, :, None] * (v[t] - recalled))
    outputs, after = one_token_at_a_time((q, k, v, g, beta), state)
    torch.testing.assert_close(after[3], want)
    torch.testing.assert_close(outputs[2], torch.einsum("hkv,hk->hv", want, q[2]))


@pytest.mark.parametrize("fresh", [True, False])
def test_prefill_in_chunks_of_any_size_equals_one_token_at_a_time(fresh):
    inputs, state = make_inputs()
    if fresh:
        state = torch.zeros_like(state)
    want, after = one_token_at_a_time(inputs, state)
    for size in range(1, LENGTH + 1):
        carried, parts = (None if fresh else state), []
        for start in range(0, LENGTH, size):
            run = chunked_gated_delta_rule(*(x[start:start + size] for x in inputs), carried,
                                           chunk=INTERNAL_CHUNK)
            parts.append(run.outputs)
            carried = run.state
        torch.testing.assert_close(torch.cat(parts), want)
        torch.testing.assert_close(carried, after[LENGTH])


def test_states_at_are_the_states_after_those_tokens():
    inputs, state = make_inputs()
    _, after = one_token_at_a_time(inputs, state)
    counts = (0, 1, 7, 8, 9, 16, 20, LENGTH)
    run = chunked_gated_delta_rule(*inputs, state, states_at=counts, chunk=INTERNAL_CHUNK)
    for n, checkpoint in zip(counts, run.checkpoints, strict=True):
        torch.testing.assert_close(checkpoint, after[n])


def test_runs_over_several_default_chunks_equal_one_token_at_a_time():
    inputs, state = make_inputs(length=150)  # 64 + 64 + 22
    want, after = one_token_at_a_time(inputs, state)
    run = chunked_gated_delta_rule(*inputs, state, states_at=(64, 100))
    torch.testing.assert_close(run.outputs, want)
    torch.testing.assert_close(run.state, after[150])
    torch.testing.assert_close(run.checkpoints, [after[64], after[100]])


def test_states_at_outside_the_run_is_refused():
    inputs, state = make_inputs()
    with pytest.raises(ValueError, match="states_at"):
        chunked_gated_delta_rule(*inputs, state, states_at=(LENGTH + 1,))


def test_default_chunk_matches_float64_in_float32_and_bfloat16_inputs_keep_a_float32_state():
    inputs, state = make_inputs()
    want = chunked_gated_delta_rule(*inputs, state)
    single = chunked_gated_delta_rule(*(x.float() for x in inputs), state.float())
    torch.testing.assert_close(single.outputs, want.outputs.float(), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(single.state, want.state.float(), rtol=1e-5, atol=1e-5)
    half = chunked_gated_delta_rule(*(x.bfloat16() for x in inputs), state.float())
    assert half.outputs.dtype == half.state.dtype == torch.float32
