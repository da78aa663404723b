"""Gated DeltaNet: the mixer gives what transformers' Qwen3-Next and Qwen3.5 layers give, a
prompt then single steps give what the whole prompt gives, and a mixed batch of decodes and
prefill segments gives what each sequence run alone gives, touching only its slots."""

import pytest
import torch
from transformers.models.qwen3_5.configuration_qwen3_5 import Qwen3_5TextConfig
from transformers.models.qwen3_5.modeling_qwen3_5 import Qwen3_5GatedDeltaNet
from transformers.models.qwen3_next.configuration_qwen3_next import Qwen3NextConfig
from transformers.models.qwen3_next.modeling_qwen3_next import Qwen3NextGatedDeltaNet

from pagoda.engine.errors import ModelLoadError
from pagoda.engine.layers.gated_delta_net import DeltaNetShape, GatedDeltaNet
from pagoda.engine.layers.gated_delta_net_weights import (
    qwen3_5_gated_delta_net,
    qwen3_next_gated_delta_net,
)
from pagoda.engine.layers.linear import Placement
from pagoda.engine.layers.recurrent_mixer import fused_decodes_then_rest
from pagoda.engine.quantization.tensors import dequantize, quantize_int8
from pagoda.kernels.kernel_ops import TORCH_OPS
from pagoda.kernels.recurrent_metadata import RecurrentMetadata, RecurrentSegment

CPU = Placement(torch.device("cpu"), torch.float32, TORCH_OPS)
HIDDEN, PROMPT = 32, 70  # longer than one internal chunk (64), ending inside the second
SIZES = {"hidden_size": HIDDEN, "linear_num_key_heads": 2, "linear_num_value_heads": 4,
         "linear_key_head_dim": 8, "linear_value_head_dim": 6, "linear_conv_kernel_dim": 4,
         "num_hidden_layers": 1, "layer_types": ["linear_attention"], "rms_norm_eps": 1e-6}
SHAPE = DeltaNetShape(num_k_heads=2, num_v_heads=4, k_dim=8, v_dim=6, conv_kernel=4)
FAMILIES = {
    "qwen3_next": (Qwen3NextConfig, Qwen3NextGatedDeltaNet, qwen3_next_gated_delta_net),
    "qwen3_5": (Qwen3_5TextConfig, Qwen3_5GatedDeltaNet, qwen3_5_gated_delta_net),
}


def reference_and_ours(family: str, dtype: torch.dtype = torch.float32,
                       ) -> tuple[torch.nn.Module, GatedDeltaNet]:
    config_class, module_class, build = FAMILIES[family]
    torch.manual_seed(0)
    reference = module_class(config_class(**SIZES), layer_idx=0).eval()
    with torch.no_grad():  # weights the defaults (ones) would hide
        reference.norm.weight.uniform_(0.5, 1.5)
        reference.dt_bias.normal_()
    reference = reference.to(dtype)
    tensors = {name: t.detach().clone() for name, t in reference.state_dict().items()}
    placement = Placement(torch.device("cpu"), dtype, TORCH_OPS)
    return reference, build(tensors, SHAPE, SIZES["rms_norm_eps"], placement)


def new_states(mixer: GatedDeltaNet, num_slots: int, fill: float = 0.0) -> tuple:
    return tuple(torch.full((num_slots, *shape), fill) for shape in mixer.state_shapes())


def prefill(start: int, end: int, slot: int, fresh: bool) -> RecurrentMetadata:
    return RecurrentMetadata(0, torch.empty(0, dtype=torch.long),
                             [RecurrentSegment(start, end, slot, fresh)])


def decode(*slots: int) -> RecurrentMetadata:
    return RecurrentMetadata(len(slots), torch.tensor(slots))


def prompt(length: int = PROMPT, seed: int = 1) -> torch.Tensor:
    return torch.randn(length, HIDDEN, generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("family", FAMILIES)
def test_whole_prompt_equals_transformers(family):
    reference, mixer = reference_and_ours(family)
    x = prompt()
    with torch.no_grad():
        want = reference(x.unsqueeze(0))[0]
    got = mixer.forward(x, prefill(0, PROMPT, 0, fresh=True), new_states(mixer, 1))
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("family", FAMILIES)
def test_bfloat16_prompt_equals_transformers(family):
    """Rounded to bfloat16 where the reference rounds, float32 state and delta rule (bit for
    bit here; bfloat16's tolerance leaves room for another matmul order)."""
    reference, mixer = reference_and_ours(family, torch.bfloat16)
    x = prompt().bfloat16()
    with torch.no_grad():
        want = reference(x.unsqueeze(0))[0]
    got = mixer.forward(x, prefill(0, PROMPT, 0, fresh=True), new_states(mixer, 1))
    torch.testing.assert_close(got, want)


@pytest.mark.parametrize("family", FAMILIES)
def test_prompt_then_single_steps_equal_the_whole_prompt(family):
    _, mixer = reference_and_ours(family)
    x = prompt()
    want = mixer.forward(x, prefill(0, PROMPT, 0, fresh=True), new_states(mixer, 1))
    states = new_states(mixer, 3)
    head = 5
    got = [mixer.forward(x[:head], prefill(0, head, 2, fresh=True), states)]
    got += [mixer.forward(x[t:t + 1], decode(2), states) for t in range(head, PROMPT)]
    torch.testing.assert_close(torch.cat(got), want, rtol=1e-4, atol=1e-5)


def test_mixed_batch_equals_each_sequence_alone_and_leaves_other_slots():
    _, mixer = reference_and_ours("qwen3_5")
    # (slot, tokens already run, tokens this step, fresh): two decodes, then two segments.
    sequences = [(3, 6, 1, False), (1, 9, 1, False), (0, 0, 11, True), (5, 4, 7, False)]
    inputs = [prompt(done + now, seed=10 + i) for i, (_, done, now, _) in enumerate(sequences)]
    states = new_states(mixer, 6, fill=0.25)  # untouched slots hold 0.25 throughout
    for (slot, done, _, _), x in zip(sequences, inputs, strict=True):
        if done:
            mixer.forward(x[:done], prefill(0, done, slot, fresh=True), states)
    untouched = [s.clone() for s in states]

    batch = torch.cat([x[done:] for (_, done, _, _), x in zip(sequences, inputs, strict=True)])
    segments = [RecurrentSegment(2, 13, 0, True), RecurrentSegment(13, 20, 5, False)]
    meta = RecurrentMetadata(2, torch.tensor([3, 1]), segments)
    got = mixer.forward(batch, meta, states)

    starts = [0, 1, 2, 13, 20]
    for i, ((slot, done, now, _), x) in enumerate(zip(sequences, inputs, strict=True)):
        alone = new_states(mixer, 1)
        want = mixer.forward(x, prefill(0, done + now, 0, fresh=True), alone)[done:]
        torch.testing.assert_close(got[starts[i]:starts[i + 1]], want, rtol=1e-4, atol=1e-5)
        for batch_state, own in zip(states, alone, strict=True):
            torch.testing.assert_close(batch_state[slot], own[0], rtol=1e-4, atol=1e-5)
    for batch_state, before in zip(states, untouched, strict=True):
        assert torch.equal(batch_state[[2, 4]], before[[2, 4]])


def test_value_heads_not_a_multiple_of_key_heads_are_refused():
    with pytest.raises(ModelLoadError, match="linear_num_value_heads"):
        DeltaNetShape(num_k_heads=3, num_v_heads=4, k_dim=8, v_dim=8, conv_kernel=4)


def test_missing_projection_is_named():
    reference, _ = reference_and_ours("qwen3_next")
    tensors = dict(reference.state_dict())
    del tensors["in_proj_ba.weight"]
    with pytest.raises(ModelLoadError, match="in_proj_ba.weight"):
        qwen3_next_gated_delta_net(tensors, SHAPE, 1e-6, CPU)


def test_quantized_qwen3_next_projections_are_reordered_like_plain_ones():
    """The interleaved rows are selected in the quantized layout itself (scales with rows).
    Not bit-exact: the int8 kernels round the activations too."""
    reference, _ = reference_and_ours("qwen3_next")
    tensors = {name: t.detach().clone() for name, t in reference.state_dict().items()}
    for name in ("in_proj_qkvz.weight", "in_proj_ba.weight"):
        tensors[name] = quantize_int8(tensors[name], group_size=32)
    quantized = qwen3_next_gated_delta_net(tensors, SHAPE, 1e-6, CPU)
    plain = qwen3_next_gated_delta_net({n: dequantize(t) for n, t in tensors.items()}, SHAPE,
                                       1e-6, CPU)
    x = prompt()
    meta = prefill(0, PROMPT, 0, fresh=True)
    got = quantized.forward(x, meta, new_states(quantized, 1))
    want = plain.forward(x, meta, new_states(plain, 1))
    assert (got - want).norm() < 0.01 * want.norm()


@pytest.mark.parametrize("family", ["qwen3_next", "qwen3_5"])
def test_decode_steps_on_the_cpu_kernels_equal_the_torch_ones(family, tmp_path):
    from pagoda.kernels.cpu import native
    from pagoda.kernels.ops import with_recurrent_steps

    if native.find_compiler() is None:
        pytest.skip("no C compiler to build pagoda/kernels/cpu/recurrent_steps.c")
    ops = with_recurrent_steps(TORCH_OPS, lambda name: native.load(name, tmp_path))
    _, mixer = reference_and_ours(family)
    x = prompt()
    head, runs = 5, []
    for kernels in (TORCH_OPS, ops):
        states = new_states(mixer, 3)
        mixer.forward(x[:head], prefill(0, head, 2, fresh=True), states)
        runs.append([mixer.forward(x[t:t + 1], decode(2), states, kernels)
                     for t in range(head, PROMPT)])
    torch.testing.assert_close(torch.cat(runs[1]), torch.cat(runs[0]), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("family", FAMILIES)
def test_decode_steps_fused_in_c_give_the_torch_paths_outputs_and_states(family, c_ops):
    """decode_ops.c's rows between in_proj and out_proj (what the one-call decode step runs)
    against the layer's torch ops, over steps whose states carry, three rows of four slots."""
    _, mixer = reference_and_ours(family)
    generator = torch.Generator().manual_seed(2)
    torch_states = tuple(torch.randn(4, *shape, generator=generator) * 0.3
                         for shape in mixer.state_shapes())
    c_states = tuple(t.clone() for t in torch_states)
    for step in range(3):
        x, meta = prompt(3, seed=10 + step), decode(3, 0, 2)
        want = mixer.forward(x, meta, torch_states, TORCH_OPS)
        got = mixer.forward(x, meta, c_states, c_ops)
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
        for ours, theirs in zip(c_states, torch_states, strict=True):
            torch.testing.assert_close(ours, theirs, rtol=1e-5, atol=1e-6)
    assert torch.equal(c_states[1][1], torch_states[1][1])  # a slot no row reads: untouched


def test_a_steps_decodes_run_fused_beside_its_prefill_as_they_do_alone(c_ops):
    """A decode rounds alike whatever else is in the step: beside a prefill segment its rows
    still go through the fused C rows (and the segment through torch's ops)."""
    _, mixer = reference_and_ours("qwen3_5")
    projected = torch.randn(9, sum(SHAPE.projection_widths),
                            generator=torch.Generator().manual_seed(3))
    generator = torch.Generator().manual_seed(4)
    mixed_states = tuple(torch.randn(3, *shape, generator=generator) * 0.3
                         for shape in mixer.state_shapes())
    alone_states = tuple(t.clone() for t in mixed_states)
    meta = RecurrentMetadata(2, torch.tensor([0, 1]), [RecurrentSegment(2, 9, 2, True)])
    mixed = fused_decodes_then_rest(
        projected, meta, lambda rows, slots: mixer._fused_decodes(rows, slots, mixed_states,
                                                                   c_ops),
        lambda rows, rows_meta: mixer._mix(rows, rows_meta, mixed_states, c_ops))
    decodes = mixer._fused_decodes(projected[:2], meta.decode_slots, alone_states, c_ops)
    segment = mixer._mix(projected[2:], meta.prefills_only(), alone_states, c_ops)
    assert torch.equal(mixed, torch.cat([decodes, segment]))
    assert all(torch.equal(a, b) for a, b in zip(mixed_states, alone_states, strict=True))
