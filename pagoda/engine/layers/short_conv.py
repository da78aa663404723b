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
from pagoda.engine.layers.recurrent_mixer import fused_decodes_then_rest
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
        """The decodes run between the two linears in one call where ops fuses them (C on a
        CPU: the one-call decode step runs the same function); otherwise, and for prefills,
        the convolution, a few taps, runs in torch."""
        conv_state, = states

        def fused(rows: torch.Tensor, slots: torch.Tensor) -> torch.Tensor | None:
            if ops.short_conv_decode is None:
                return None
            return ops.short_conv_decode(rows, slots, conv_state, self.weight, self.bias)

        mixed = fused_decodes_then_rest(
            self.in_proj(x), meta, fused,
            lambda rows, rows_meta: self._mix(rows, rows_meta, conv_state))
        return self.out_proj(mixed.to(x.dtype))

    def _mix(self, projected: torch.Tensor, meta: RecurrentMetadata,
             conv_state: torch.Tensor) -> torch.Tensor:
        """in_proj's output -> what out_proj reads, in torch's ops."""
        b, c, h = projected.chunk(3, dim=-1)
        bx = b * h
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
        return c * out
