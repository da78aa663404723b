"""LFM2's gated short convolution, a recurrent mixer (pagoda.engine.layers.recurrent_mixer):
in_proj splits each token into B, C and x; B * x goes through a depthwise causal convolution of
a few taps (no activation); C gates its output; out_proj projects back. The state a sequence
carries is the convolution's last kernel-1 inputs."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from pagoda.engine.layers.causal_conv import causal_conv_prefill, causal_conv_step
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
        """A step of decodes alone runs between the two linears in one call where ops fuses
        it (C on a CPU: the one-call decode step runs the same function); otherwise the
        convolution, a few taps, runs in torch."""
        projected = self.in_proj(x)
        conv_state, = states
        if not meta.prefills and ops.short_conv_decode is not None:
            mixed = ops.short_conv_decode(projected, meta.decode_slots, conv_state, self.weight,
                                          self.bias)
            if mixed is not None:
                return self.out_proj(mixed.to(x.dtype))
        b, c, h = projected.chunk(3, dim=-1)
        bx = b * h
        out = torch.empty_like(bx)
        n = meta.num_decodes
        if n:
            out[:n] = causal_conv_step(bx[:n], conv_state, meta.decode_slots, self.weight,
                                       self.bias, silu=False)
        for seg in meta.prefills:
            state = None if seg.fresh else conv_state[seg.slot]
            y, conv_state[seg.slot] = causal_conv_prefill(bx[seg.start:seg.end], self.weight,
                                                          self.bias, state, silu=False)
            out[seg.start:seg.end] = y
        return self.out_proj(c * out)
