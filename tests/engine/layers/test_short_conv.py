"""LFM2's gated short convolution: a step of decodes fused in C (decode_ops.c's rows between
in_proj and out_proj, what the one-call decode step runs) gives the layer's torch ops'
outputs and windows, with and without a bias."""

import pytest
import torch

from pagoda.engine.layers.linear import Placement, make_linear
from pagoda.engine.layers.short_conv import ShortConv
from pagoda.kernels.kernel_ops import TORCH_OPS
from pagoda.kernels.recurrent_metadata import RecurrentMetadata

CPU = Placement(torch.device("cpu"), torch.float32, TORCH_OPS)
HIDDEN, KERNEL = 40, 3


def short_conv(bias: bool) -> ShortConv:
    generator = torch.Generator().manual_seed(0)

    def draw(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=generator) * 0.3

    return ShortConv(in_proj=make_linear(draw(3 * HIDDEN, HIDDEN), None, CPU),
                     out_proj=make_linear(draw(HIDDEN, HIDDEN), None, CPU),
                     weight=draw(HIDDEN, KERNEL), bias=draw(HIDDEN) if bias else None)


@pytest.mark.parametrize("bias", [False, True], ids=["no bias", "bias"])
def test_decode_steps_fused_in_c_give_the_torch_paths_outputs_and_windows(bias, c_ops):
    conv = short_conv(bias)
    torch_state = torch.randn(4, HIDDEN, KERNEL - 1, generator=torch.Generator().manual_seed(1))
    c_state = torch_state.clone()
    meta = RecurrentMetadata(3, torch.tensor([3, 0, 2]))
    for step in range(3):
        x = torch.randn(3, HIDDEN, generator=torch.Generator().manual_seed(10 + step))
        want = conv.forward(x, meta, (torch_state,), TORCH_OPS)
        got = conv.forward(x, meta, (c_state,), c_ops)
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(c_state, torch_state, rtol=1e-6, atol=1e-7)
    assert torch.equal(c_state[1], torch_state[1])  # a slot no row reads: untouched
