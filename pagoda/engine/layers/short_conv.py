"""LFM2's gated short convolution, a recurrent mixer (pagoda.engine.layers.recurrent_mixer):
in_proj splits each token into B, C and x; B * x goes through a depthwise causal convolution of
a few taps (no activation); C gates its output; out_proj projects back. The state a sequence
carries is the convolution's last kernel-1 inputs."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from pagoda.engine.layers.causal_conv import (
    causal_conv_prefill,
    causal_conv_step,
    conv_states_after_each,
)
from pagoda.engine.layers.linear import Linear
from pagoda.kernels.kernel_ops import TORCH_OPS, KernelOps
from pagoda.kernels.recurrent_metadata import RecurrentMetadata


@dataclass(slots=True)
class ShortConv:
    in_proj: Linear  # hidden -> 3 x hidden: B, C, x
    out_proj: Linear
    weight: torch.Tensor  # [hidden, kernel]
    bias: torch.Tensor | None  # [hidden]

    def state_shapes(self) -> tuple[tuple[int, ...], ...]:
        channels, kernel = self.weight.shape
        return ((channels, kernel - 1),)

    def forward(self, x: torch.Tensor, meta: RecurrentMetadata,
                states: tuple[torch.Tensor, ...], ops: KernelOps = TORCH_OPS) -> torch.Tensor:
        """The convolution is a few taps: it runs in torch whatever `ops` holds."""
        b, c, h = self.in_proj(x).chunk(3, dim=-1)
        bx = b * h
        conv_state, = states
        out = torch.empty_like(bx)
        n = meta.num_decodes
        if n:
            out[:n] = causal_conv_step(bx[:n], conv_state, meta.decode_slots, self.weight,
                                       self.bias, silu=False)
        kernel = self.weight.shape[1]
        for seg in meta.prefills:
            state = None if seg.fresh else conv_state[seg.slot]
            if seg.verifies:
                meta.kept.keep(conv_state, seg.slot, conv_states_after_each(
                    bx[seg.start:seg.end], state, kernel))
            y, conv_state[seg.slot] = causal_conv_prefill(bx[seg.start:seg.end], self.weight,
                                                          self.bias, state, silu=False)
            out[seg.start:seg.end] = y
        return self.out_proj(c * out)
