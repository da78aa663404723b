"""The Mamba-2 mixer (Granite 4's "mamba" layers): in_proj gives a gate z, the scan's inputs x, B
and C (convolved together, then SiLU), and a time step per head; the scan (pagoda.engine.layers.ssd)
runs over them with a state per sequence; its output is gated and RMS-normed per group, then
projected back by out_proj.

Each sequence owns a slot in the layer's two state tensors: the convolution's last kernel-1 inputs
and the SSM state, both float32 (`state_shapes`, allocated by the runner).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from pagoda.engine.errors import ModelLoadError
from pagoda.engine.layers.causal_conv import (
    causal_conv_prefill,
    causal_conv_step,
    conv_states_after_each,
)
from pagoda.engine.layers.linear import Linear, Placement, make_linear
from pagoda.engine.layers.recurrent_mixer import fused_decodes_then_rest
from pagoda.engine.layers.ssd import SsmParams, ssd_prefill, ssd_step
from pagoda.engine.quantization.tensors import Weight
from pagoda.kernels.kernel_ops import TORCH_OPS, KernelOps
from pagoda.kernels.recurrent_metadata import KeptStates, RecurrentMetadata, RecurrentSegment


@dataclass(slots=True, frozen=True)
class Mamba2Config:
    """A Mamba-2 layer's geometry (Granite 4's config.json: mamba_n_heads, mamba_d_head,
    mamba_d_state, mamba_n_groups, mamba_d_conv, rms_norm_eps, time_step_limit). norm_groups:
    the gated RMSNorm's groups over the heads' outputs (None: one per B/C group, as Granite 4 and
    the reference Mamba-2 do).

    chunk_size: the scan's chunk, free to choose: the outputs do not depend on it beyond
    rounding. config.json's mamba_chunk_size (256) is the GPU kernels' tile; on a CPU 64 ran the
    scan 2.3-2.7x faster at Granite 4's widths (bench/mamba2_layer.py), and as accurately."""

    num_heads: int
    head_dim: int
    state_size: int
    n_groups: int
    conv_kernel: int
    chunk_size: int
    eps: float
    time_step_limit: tuple[float, float] = (0.0, math.inf)
    norm_groups: int | None = None

    @property
    def inner_size(self) -> int:
        return self.num_heads * self.head_dim

    @property
    def conv_channels(self) -> int:
        """x, B and C side by side: what the convolution runs over."""
        return self.inner_size + 2 * self.n_groups * self.state_size


@dataclass(slots=True)
class Mamba2Mixer:
    in_proj: Linear  # z, x|B|C, dt side by side
    out_proj: Linear
    conv_weight: torch.Tensor  # [conv_channels, kernel]
    conv_bias: torch.Tensor | None
    ssm: SsmParams
    norm_weight: torch.Tensor  # [inner_size] float32
    config: Mamba2Config

    @classmethod
    def from_hf(cls, tensors: Mapping[str, Weight], config: Mamba2Config,
                placement: Placement) -> Mamba2Mixer:
        """From one layer's tensors under Hugging Face's names relative to the mixer
        (in_proj.weight, conv1d.weight, A_log, ...); in_proj and out_proj may be quantized."""
        c = config
        in_width = 2 * c.inner_size + 2 * c.n_groups * c.state_size + c.num_heads
        if tensors["in_proj.weight"].shape[0] != in_width:
            raise ModelLoadError(
                f"This Mamba-2 layer's in_proj gives {tensors['in_proj.weight'].shape[0]} "
                f"outputs where its config ({c.num_heads} heads of {c.head_dim}, {c.n_groups} "
                f"groups of state {c.state_size}) needs {in_width}: config.json does not match "
                "the weights.")
        small = {name: tensors[name].to(device=placement.device, dtype=torch.float32)
                 for name in ("A_log", "D", "dt_bias", "norm.weight")}
        low, high = c.time_step_limit
        conv_bias = tensors.get("conv1d.bias")
        return cls(
            in_proj=make_linear(tensors["in_proj.weight"], tensors.get("in_proj.bias"), placement),
            out_proj=make_linear(tensors["out_proj.weight"], tensors.get("out_proj.bias"),
                                 placement),
            conv_weight=tensors["conv1d.weight"].reshape(c.conv_channels, c.conv_kernel).to(
                device=placement.device, dtype=placement.dtype),
            conv_bias=(None if conv_bias is None else
                       conv_bias.to(device=placement.device, dtype=placement.dtype)),
            ssm=SsmParams(A=-torch.exp(small["A_log"]), D=small["D"], dt_bias=small["dt_bias"],
                          n_groups=c.n_groups, chunk_size=c.chunk_size, dt_min=low, dt_max=high),
            norm_weight=small["norm.weight"], config=c)

    def state_shapes(self) -> tuple[tuple[int, ...], ...]:
        """Per slot: the convolution's window, the SSM state."""
        c = self.config
        return ((c.conv_channels, c.conv_kernel - 1), (c.num_heads, c.head_dim, c.state_size))

    def forward(self, x: torch.Tensor, meta: RecurrentMetadata,
                states: tuple[torch.Tensor, ...], ops: KernelOps = TORCH_OPS) -> torch.Tensor:
        """x [num_tokens, hidden], decodes first then prefill segments (`meta`); states: the
        layer's conv and SSM states [num_slots, *shape] (state_shapes), updated in place; ops:
        the kernels a decode's state update runs on (pagoda/kernels/ops.py). The decodes run
        between the two linears in one call where ops fuses them (C on a CPU: the one-call
        decode step runs the same function)."""
        assert x.shape[0] == meta.num_tokens, "the batch and its metadata disagree"
        mixed = fused_decodes_then_rest(
            self.in_proj(x), meta,
            lambda rows, slots: self._fused_decodes(rows, slots, states, ops),
            lambda rows, rows_meta: self._mix(rows, rows_meta, states, ops))
        return self.out_proj(mixed.to(x.dtype))

    def _mix(self, projected: torch.Tensor, meta: RecurrentMetadata,
             states: tuple[torch.Tensor, ...], ops: KernelOps) -> torch.Tensor:
        """in_proj's output -> what out_proj reads, in torch's ops (the decodes' state updates
        on ops.mamba2_step)."""
        c = self.config
        z, xbc, dt = projected.split((c.inner_size, c.conv_channels, c.num_heads), dim=-1)
        parts = []
        if meta.num_decodes:
            n = meta.num_decodes
            parts.append(self._decode(xbc[:n], dt[:n], meta.decode_slots, states, ops))
        parts.extend(self._prefill(xbc[s.start:s.end], dt[s.start:s.end], s, states,
                                   meta.kept) for s in meta.prefills)
        y = torch.cat(parts).reshape(projected.shape[0], c.inner_size)
        return self._gated_norm(y, z)

    def _fused_decodes(self, rows: torch.Tensor, slots: torch.Tensor,
                       states: tuple[torch.Tensor, ...], ops: KernelOps) -> torch.Tensor | None:
        """ops.mamba2_decode's rows (None where there is none or it does not take these
        tensors)."""
        if ops.mamba2_decode is None:
            return None
        c, ssm = self.config, self.ssm
        shape = (c.num_heads, c.head_dim, c.state_size, c.n_groups, c.norm_groups or c.n_groups)
        return ops.mamba2_decode(rows, slots, states, self.conv_weight, self.conv_bias,
                                 ssm.A, ssm.D, ssm.dt_bias, self.norm_weight, shape,
                                 (ssm.dt_min, ssm.dt_max), c.eps)

    def _decode(self, xbc: torch.Tensor, dt: torch.Tensor, slots: torch.Tensor,
                states: tuple[torch.Tensor, ...], ops: KernelOps) -> torch.Tensor:
        conv_states, ssm_states = states
        xbc = causal_conv_step(xbc, conv_states, slots, self.conv_weight, self.conv_bias,
                               silu=True)
        x, B, C = self._split(xbc)
        return ssd_step(x, dt, B, C, self.ssm, ssm_states, slots, ops)

    def _prefill(self, xbc: torch.Tensor, dt: torch.Tensor, segment: RecurrentSegment,
                 states: tuple[torch.Tensor, ...], kept: KeptStates) -> torch.Tensor:
        conv_states, ssm_states = states
        slot = segment.slot
        before = None if segment.fresh else conv_states[slot]
        if segment.verifies:
            kept.keep(conv_states, slot, conv_states_after_each(xbc, before,
                                                                self.config.conv_kernel))
        xbc, conv_state = causal_conv_prefill(xbc, self.conv_weight, self.conv_bias, before,
                                              silu=True)
        x, B, C = self._split(xbc)
        each = tuple(range(1, x.shape[0] + 1)) if segment.verifies else ()
        run = ssd_prefill(x, dt, B, C, self.ssm, None if segment.fresh else ssm_states[slot],
                          each)
        conv_states[slot].copy_(conv_state)
        ssm_states[slot].copy_(run.final_state)
        if segment.verifies:
            kept.keep(ssm_states, slot, torch.stack(run.states_at))
        return run.y

    def _split(self, xbc: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The convolved x|B|C as x [tokens, heads, head_dim], B and C [tokens, n_groups,
        state_size]."""
        c = self.config
        x, B, C = xbc.split((c.inner_size, c.n_groups * c.state_size,
                             c.n_groups * c.state_size), dim=-1)
        groups = (-1, c.n_groups, c.state_size)
        return x.reshape(-1, c.num_heads, c.head_dim), B.reshape(groups), C.reshape(groups)

    def _gated_norm(self, y: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
        """RMSNorm of y * silu(z) over each group of the heads' outputs, in float32 (the gate
        goes before the norm: Mamba-2's norm_before_gate=False)."""
        groups = self.config.norm_groups or self.config.n_groups
        gated = (y.float() * F.silu(z.float())).view(y.shape[0], groups, -1)
        normed = gated * torch.rsqrt(gated.pow(2).mean(-1, keepdim=True) + self.config.eps)
        return self.norm_weight * normed.view(y.shape[0], -1)
