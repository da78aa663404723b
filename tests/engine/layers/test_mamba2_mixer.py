"""The Mamba-2 mixer: what transformers' Granite 4 mamba layer computes, whether a sequence comes
as one prompt, as a prompt then single steps, or beside others in a mixed batch."""

import dataclasses

import pytest
import torch
from transformers import GraniteMoeHybridConfig
from transformers.models.granitemoehybrid.modeling_granitemoehybrid import (
    GraniteMoeHybridMambaLayer,
)

from pagoda.engine.errors import ModelLoadError
from pagoda.engine.layers.linear import Placement
from pagoda.engine.layers.mamba2 import Mamba2Config, Mamba2Mixer
from pagoda.kernels.kernel_ops import TORCH_OPS
from pagoda.kernels.recurrent_metadata import RecurrentMetadata, RecurrentSegment

CPU = Placement(torch.device("cpu"), torch.float32, TORCH_OPS)
HIDDEN, LENGTH, NUM_SLOTS = 16, 13, 6


@pytest.fixture(scope="module")
def reference():
    """A tiny Granite 4 mamba layer: 4 heads of 8 in 2 groups of state 6, chunks of 4 (so a
    prompt spans several, the last one short), random weights throughout."""
    torch.manual_seed(0)
    config = GraniteMoeHybridConfig(
        hidden_size=HIDDEN, num_hidden_layers=1, layer_types=["mamba"], mamba_n_heads=4,
        mamba_d_head=8, mamba_d_state=6, mamba_n_groups=2, mamba_d_conv=4, mamba_expand=2,
        mamba_chunk_size=4, mamba_conv_bias=True, mamba_proj_bias=True, rms_norm_eps=1e-5)
    layer = GraniteMoeHybridMambaLayer(config, layer_idx=0).eval()
    with torch.no_grad():
        for name, p in layer.named_parameters():
            p.copy_(torch.randn_like(p) * (0.3 if p.dim() > 1 else 1.0))
        layer.A_log.copy_(torch.log(torch.rand(4) * 3 + 0.5))
    return config, layer


def mixer_of(config, layer):
    ours = Mamba2Config(
        num_heads=config.mamba_n_heads, head_dim=config.mamba_d_head,
        state_size=config.mamba_d_state, n_groups=config.mamba_n_groups,
        conv_kernel=config.mamba_d_conv, chunk_size=config.mamba_chunk_size,
        eps=config.rms_norm_eps, time_step_limit=config.time_step_limit)
    return Mamba2Mixer.from_hf(dict(layer.state_dict()), ours, CPU)


def empty_states(mixer, fill=0.0):
    return tuple(torch.full((NUM_SLOTS, *shape), fill) for shape in mixer.state_shapes())


def prefill(start, end, slot, fresh):
    return RecurrentMetadata(0, torch.zeros(0, dtype=torch.int64),
                             [RecurrentSegment(start, end, slot, fresh)])


def decode(*slots):
    return RecurrentMetadata(len(slots), torch.tensor(slots, dtype=torch.int64))


def prompt(length=LENGTH, seed=1):
    return torch.randn(length, HIDDEN, generator=torch.Generator().manual_seed(seed))


def test_whole_prompt_equals_transformers(reference):
    config, layer = reference
    mixer = mixer_of(config, layer)
    x = prompt()
    with torch.no_grad():
        want = layer(x[None])[0]
    got = mixer.forward(x, prefill(0, LENGTH, 2, True), empty_states(mixer))
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("prompt_length", [1, 3, 4, 9])
def test_prompt_then_single_steps_equals_the_whole_prompt(reference, prompt_length):
    mixer = mixer_of(*reference)
    x = prompt()
    whole = mixer.forward(x, prefill(0, LENGTH, 0, True), empty_states(mixer))
    states = empty_states(mixer)
    outputs = [mixer.forward(x[:prompt_length], prefill(0, prompt_length, 4, True), states)]
    outputs += [mixer.forward(x[t:t + 1], decode(4), states)
                for t in range(prompt_length, LENGTH)]
    torch.testing.assert_close(torch.cat(outputs), whole, rtol=1e-5, atol=1e-5)


def test_mixed_batch_equals_each_sequence_alone_and_leaves_other_slots(reference):
    """Two decodes (slots 3 and 1), then a fresh prompt (slot 0) and a prompt's second chunk
    (slot 4); slots 2 and 5 belong to nobody in this step."""
    mixer = mixer_of(*reference)
    histories = {3: prompt(5, seed=2), 1: prompt(7, seed=3), 4: prompt(6, seed=4)}
    batch_states = empty_states(mixer, fill=7.0)
    alone = {}
    for slot, history in histories.items():
        alone[slot] = empty_states(mixer)
        mixer.forward(history, prefill(0, len(history), slot, True), alone[slot])
        mixer.forward(history, prefill(0, len(history), slot, True), batch_states)
    alone[0] = empty_states(mixer)
    tokens = {3: prompt(1, seed=5), 1: prompt(1, seed=6), 0: prompt(5, seed=7),
              4: prompt(4, seed=8)}
    want = {3: mixer.forward(tokens[3], decode(3), alone[3]),
            1: mixer.forward(tokens[1], decode(1), alone[1]),
            0: mixer.forward(tokens[0], prefill(0, 5, 0, True), alone[0]),
            4: mixer.forward(tokens[4], prefill(0, 4, 4, False), alone[4])}
    untouched = [s[[2, 5]].clone() for s in batch_states]
    meta = RecurrentMetadata(2, torch.tensor([3, 1]), [RecurrentSegment(2, 7, 0, True),
                                                       RecurrentSegment(7, 11, 4, False)])
    got = mixer.forward(torch.cat([tokens[s] for s in (3, 1, 0, 4)]), meta, batch_states)
    torch.testing.assert_close(got, torch.cat([want[s] for s in (3, 1, 0, 4)]))
    for slot in (3, 1, 0, 4):
        for batch_state, own in zip(batch_states, alone[slot]):
            torch.testing.assert_close(batch_state[slot], own[slot])
    for before, state in zip(untouched, batch_states):
        assert torch.equal(state[[2, 5]], before)


def test_state_shapes_are_the_conv_window_and_the_ssm_state(reference):
    mixer = mixer_of(*reference)
    # conv over x|B|C: 4 heads x 8 + 2 x (2 groups x state 6); SSM state per head.
    assert mixer.state_shapes() == ((32 + 24, 3), (4, 8, 6))


def test_config_that_does_not_match_the_weights_is_refused(reference):
    config, layer = reference
    wrong = Mamba2Config(num_heads=4, head_dim=8, state_size=5, n_groups=2, conv_kernel=4,
                         chunk_size=4, eps=1e-5)
    with pytest.raises(ModelLoadError, match="in_proj"):
        Mamba2Mixer.from_hf(dict(layer.state_dict()), wrong, CPU)


def test_bf16_activations_keep_float32_states_and_track_float32(reference):
    config, layer = reference
    mixer = mixer_of(config, layer)
    ours = Mamba2Mixer.from_hf(dict(layer.state_dict()), mixer.config,
                               Placement(torch.device("cpu"), torch.bfloat16, TORCH_OPS))
    x = prompt()
    want = mixer.forward(x[:9], prefill(0, 9, 0, True), empty_states(mixer))
    states = empty_states(ours)
    got = ours.forward(x[:9].to(torch.bfloat16), prefill(0, 9, 0, True), states)
    assert got.dtype == torch.bfloat16
    assert all(s.dtype == torch.float32 for s in states)
    # bf16 projections: a percent of the output's size, not fp32's 1e-6.
    assert (got.float() - want).abs().max() < 0.02 * want.abs().max()


@pytest.mark.parametrize("prompt_length", [1, 9])
def test_decode_steps_on_the_cpu_kernels_equal_the_torch_ones(reference, prompt_length,
                                                              tmp_path):
    from pagoda.kernels.cpu import native
    from pagoda.kernels.ops import with_recurrent_steps

    if native.find_compiler() is None:
        pytest.skip("no C compiler to build pagoda/kernels/cpu/recurrent_steps.c")
    ops = with_recurrent_steps(TORCH_OPS, lambda name: native.load(name, tmp_path))
    assert ops.mamba2_step is not TORCH_OPS.mamba2_step
    mixer = mixer_of(*reference)
    x = prompt()
    runs = []
    for kernels in (TORCH_OPS, ops):
        states = empty_states(mixer)
        mixer.forward(x[:prompt_length], prefill(0, prompt_length, 4, True), states)
        runs.append([mixer.forward(x[t:t + 1], decode(4), states, kernels)
                     for t in range(prompt_length, LENGTH)])
    torch.testing.assert_close(torch.cat(runs[1]), torch.cat(runs[0]), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("dt_limits", [None, (0.05, 0.8)], ids=["no limits", "limits"])
def test_decode_steps_fused_in_c_give_the_torch_paths_outputs_and_states(reference, dt_limits,
                                                                        c_ops):
    """decode_ops.c's rows between in_proj and out_proj (what the one-call decode step runs)
    against the layer's torch ops, over steps whose states carry, three rows of six slots."""
    mixer = mixer_of(*reference)
    if dt_limits is not None:
        mixer.ssm = dataclasses.replace(mixer.ssm, dt_min=dt_limits[0], dt_max=dt_limits[1])
    generator = torch.Generator().manual_seed(2)
    torch_states = tuple(torch.randn(NUM_SLOTS, *shape, generator=generator) * 0.3
                         for shape in mixer.state_shapes())
    c_states = tuple(t.clone() for t in torch_states)
    for step in range(3):
        x, meta = prompt(3, seed=10 + step), decode(5, 0, 2)
        want = mixer.forward(x, meta, torch_states, TORCH_OPS)
        got = mixer.forward(x, meta, c_states, c_ops)
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
        for ours, theirs in zip(c_states, torch_states, strict=True):
            torch.testing.assert_close(ours, theirs, rtol=1e-5, atol=1e-6)
    assert all(torch.equal(ours[1], theirs[1])  # a slot no row reads: untouched
               for ours, theirs in zip(c_states, torch_states, strict=True))
