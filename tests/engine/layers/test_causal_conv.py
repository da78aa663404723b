"""The short causal convolution: chunks and single steps give what one pass over the whole
sequence gives, and the state is the last kernel-1 inputs."""

import pytest
import torch
import torch.nn.functional as F

from pagoda.engine.layers.causal_conv import causal_conv_prefill, causal_conv_step

CHANNELS, KERNEL, LENGTH = 6, 4, 11


def reference(x, weight, bias, silu):
    """nn.Conv1d with kernel-1 zeros of left padding, as Hugging Face's models run it."""
    y = F.conv1d(x.t().unsqueeze(0), weight.unsqueeze(1), bias, padding=KERNEL - 1,
                 groups=CHANNELS)[0, :, :x.shape[0]].t()
    return F.silu(y) if silu else y


@pytest.fixture
def inputs():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(LENGTH, CHANNELS, generator=g, dtype=torch.float64)
    weight = torch.randn(CHANNELS, KERNEL, generator=g, dtype=torch.float64)
    bias = torch.randn(CHANNELS, generator=g, dtype=torch.float64)
    return x, weight, bias


@pytest.mark.parametrize("silu", [False, True])
@pytest.mark.parametrize("with_bias", [False, True])
def test_prefill_in_any_chunks_equals_one_pass(inputs, silu, with_bias):
    x, weight, bias = inputs
    bias = bias if with_bias else None
    want = reference(x, weight, bias, silu)
    for chunk in range(1, LENGTH + 1):
        state, parts = None, []
        for start in range(0, LENGTH, chunk):
            y, state = causal_conv_prefill(x[start:start + chunk], weight, bias, state, silu)
            parts.append(y)
        torch.testing.assert_close(torch.cat(parts), want)
        torch.testing.assert_close(state, x[-(KERNEL - 1):].t())


def test_prefill_shorter_than_the_kernel_keeps_zeros_before_it(inputs):
    x, weight, bias = inputs
    _, state = causal_conv_prefill(x[:1], weight, bias, None, silu=False)
    torch.testing.assert_close(state[:, :-1], torch.zeros(CHANNELS, KERNEL - 2,
                                                          dtype=torch.float64))
    torch.testing.assert_close(state[:, -1], x[0])


@pytest.mark.parametrize("silu", [False, True])
def test_steps_advance_only_their_slots(inputs, silu):
    x, weight, bias = inputs
    want = reference(x, weight, bias, silu)
    prompt = 5
    _, state = causal_conv_prefill(x[:prompt], weight, bias, None, silu)
    states = torch.full((4, CHANNELS, KERNEL - 1), 7.0, dtype=torch.float64)
    states[2] = state
    slots = torch.tensor([2])
    for t in range(prompt, LENGTH):
        y = causal_conv_step(x[t:t + 1], states, slots, weight, bias, silu)
        torch.testing.assert_close(y[0], want[t])
    assert (states[[0, 1, 3]] == 7.0).all()
    torch.testing.assert_close(states[2], x[-(KERNEL - 1):].t())
