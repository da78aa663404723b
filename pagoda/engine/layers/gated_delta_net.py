"""Gated DeltaNet, the linear-attention mixer of Qwen3-Next's and Qwen3.5's hybrid layers.

One projection gives the convolved channels (queries, keys, values), the output gate z, and per
value head beta (the correction's strength) and a (the decay's time step). The channels pass the
short causal conv with SiLU; queries and keys are l2-normed per head and repeated to the value
heads (each key head serves num_v_heads / num_k_heads consecutive value heads); the gated delta
rule (pagoda.engine.layers.gated_delta_rule) mixes them over time; each value head's output is
RMS-normed, gated by SiLU(z) and projected back to the hidden size.

A sequence carries two states between steps, in its slot of each tensor (RecurrentMetadata):
the conv's last kernel-1 inputs and the delta rule's [v_heads, k_dim, v_dim] matrix, both float32.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from pagoda.engine.errors import ModelLoadError
from pagoda.engine.layers.causal_conv import (
    causal_conv_prefill,
    causal_conv_step,
    conv_states_after_each,
)
from pagoda.engine.layers.gated_delta_rule import CHUNK, chunked_gated_delta_rule
from pagoda.engine.layers.linear import Linear
from pagoda.engine.layers.recurrent_mixer import fused_decodes_then_rest
from pagoda.kernels.kernel_ops import TORCH_OPS, KernelOps
from pagoda.kernels.recurrent_metadata import KeptStates, RecurrentMetadata, RecurrentSegment
from pagoda.kernels.recurrent_steps import value_heads

L2_EPS = 1e-6  # inside the square root, as the reference's l2norm (FLA's) has it


@dataclass(slots=True, frozen=True)
class DeltaNetShape:
    num_k_heads: int
    num_v_heads: int
    k_dim: int
    v_dim: int
    conv_kernel: int
    # Value head h reads key head h % num_k_heads (llama.cpp's converter writes Qwen3-Next's and
    # Qwen3.5's value heads tiled over the key heads), not h // (num_v_heads / num_k_heads).
    tiled: bool = False

    def __post_init__(self) -> None:
        if self.num_v_heads % self.num_k_heads:
            raise ModelLoadError(
                f"This model's Gated DeltaNet has {self.num_v_heads} value heads for "
                f"{self.num_k_heads} key heads; Pagoda runs it only where each key head serves "
                f"a whole number of value heads (check linear_num_value_heads in config.json).")

    @property
    def key_width(self) -> int:
        return self.num_k_heads * self.k_dim

    @property
    def value_width(self) -> int:
        return self.num_v_heads * self.v_dim

    @property
    def conv_channels(self) -> int:
        return 2 * self.key_width + self.value_width

    @property
    def projection_widths(self) -> tuple[int, int, int, int]:
        """in_proj's output: conv channels (q, k, v), z, beta's logits, a."""
        return self.conv_channels, self.value_width, self.num_v_heads, self.num_v_heads


@dataclass(slots=True)
class GatedDeltaNet:
    in_proj: Linear  # [q | k | v | z | b | a] (DeltaNetShape.projection_widths), heads in order
    conv_weight: torch.Tensor  # [conv_channels, kernel], no bias
    decay_rate: torch.Tensor  # exp(A_log) [v_heads] float32: g = -rate * softplus(a + dt_bias)
    dt_bias: torch.Tensor  # [v_heads] float32
    norm_weight: torch.Tensor  # [v_dim], shared by the value heads
    out_proj: Linear
    shape: DeltaNetShape
    eps: float

    def state_shapes(self) -> tuple[tuple[int, ...], ...]:
        """Each slot's states: the conv window, then the delta rule's matrices."""
        s = self.shape
        return (s.conv_channels, s.conv_kernel - 1), (s.num_v_heads, s.k_dim, s.v_dim)

    def forward(self, x: torch.Tensor, meta: RecurrentMetadata,
                states: tuple[torch.Tensor, ...], ops: KernelOps = TORCH_OPS) -> torch.Tensor:
        """x [num_tokens, hidden] laid out as `meta` says; states[i] [num_slots,
        *state_shapes()[i]] float32, the batch's slots read and written in place. The decodes
        run between the two linears in one call where ops fuses them (C on a CPU: the one-call
        decode step runs the same function); otherwise their state updates run on ops.gdn_step
        (in C on a CPU) among torch's ops, as the prefills' runs do."""
        projected = self.in_proj(x)
        mixed = fused_decodes_then_rest(
            projected, meta, lambda rows, slots: self._fused_decodes(rows, slots, states, ops),
            lambda rows, rows_meta: self._mix(rows, rows_meta, states, ops))
        return self.out_proj(mixed.to(x.dtype))

    def _fused_decodes(self, rows: torch.Tensor, slots: torch.Tensor,
                       states: tuple[torch.Tensor, ...], ops: KernelOps) -> torch.Tensor | None:
        if ops.gated_delta_decode is None:
            return None
        s = self.shape
        return ops.gated_delta_decode(
            rows, slots, states, self.conv_weight, self.decay_rate, self.dt_bias,
            self.norm_weight, (s.num_k_heads, s.num_v_heads, s.k_dim, s.v_dim), s.tiled, self.eps)

    def _mix(self, projected: torch.Tensor, meta: RecurrentMetadata,
             states: tuple[torch.Tensor, ...], ops: KernelOps) -> torch.Tensor:
        """in_proj's output -> what out_proj reads, in torch's ops (the decodes' state updates
        on ops.gdn_step)."""
        conv_states, delta_states = states
        channels, z, b, a = projected.split(self.shape.projection_widths, dim=-1)
        q, k, v = self._queries_keys_values(self._convolve(channels, meta, conv_states))
        beta = b.sigmoid().float()  # rounded at the compute dtype, as the reference
        g = -self.decay_rate * F.softplus(a.float() + self.dt_bias)
        mixed = _delta_rule(q, k, v, g, beta, meta, delta_states, self.shape.tiled, ops)
        return self._gated_norm(mixed.to(projected.dtype), z).flatten(1)

    def _convolve(self, channels: torch.Tensor, meta: RecurrentMetadata,
                  conv_states: torch.Tensor) -> torch.Tensor:
        parts = []
        if meta.num_decodes:
            parts.append(causal_conv_step(channels[:meta.num_decodes], conv_states,
                                          meta.decode_slots, self.conv_weight, None, silu=True))
        for seg in meta.prefills:
            before = None if seg.fresh else conv_states[seg.slot]
            run = channels[seg.start:seg.end]
            if seg.verifies:
                meta.kept.keep(conv_states, seg.slot, conv_states_after_each(
                    run, before, self.shape.conv_kernel))
            y, after = causal_conv_prefill(run, self.conv_weight, None, before, silu=True)
            conv_states[seg.slot] = after
            parts.append(y)
        return parts[0] if len(parts) == 1 else torch.cat(parts)

    def _queries_keys_values(self, mixed: torch.Tensor
                             ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """float32 [tokens, heads, dim] each: q and k per key head, l2-normed (q also scaled
        by k_dim^-1/2); v per value head."""
        s = self.shape
        n = mixed.shape[0]
        q, k, v = mixed.float().split((s.key_width, s.key_width, s.value_width), dim=-1)
        q = _l2_norm(q.view(n, s.num_k_heads, s.k_dim)) * s.k_dim ** -0.5
        k = _l2_norm(k.view(n, s.num_k_heads, s.k_dim))
        return q, k, v.view(n, s.num_v_heads, s.v_dim)

    def _gated_norm(self, mixed: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
        """RMSNorm of each value head's output, then times SiLU(z), z split like the heads.
        The rounding to the compute dtype between norm and weight is the reference's."""
        dtype = mixed.dtype
        h = mixed.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        h = self.norm_weight * h.to(dtype)
        gate = F.silu(z.float()).view_as(h)
        return (h * gate).to(dtype)


def _delta_rule(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor,
                beta: torch.Tensor, meta: RecurrentMetadata, delta_states: torch.Tensor,
                tiled: bool, ops: KernelOps) -> torch.Tensor:
    """[tokens, v_heads, v_dim] float32: the decodes' steps (q and k per key head), then each
    prefill segment's run from its slot's state (zeros where fresh), its final state written
    back (q and k repeated to the value heads); a verifying segment's tokens one by one as
    decodes (`_verify`)."""
    out = v.new_empty(v.shape)
    d = meta.num_decodes
    if d:
        out[:d] = ops.gdn_step(delta_states, meta.decode_slots, q[:d], k[:d], v[:d], g[:d],
                               beta[:d], tiled)
    runs = [seg for seg in meta.prefills if not seg.verifies]
    if runs:
        q_heads, k_heads = (value_heads(t, v.shape[1], tiled) for t in (q, k))
    for seg in runs:
        run_slice = slice(seg.start, seg.end)
        before = None if seg.fresh else delta_states[seg.slot]
        run = chunked_gated_delta_rule(q_heads[run_slice], k_heads[run_slice], v[run_slice],
                                       g[run_slice], beta[run_slice], before,
                                       chunk=_chunk_for(seg.end - seg.start))
        out[run_slice] = run.outputs
        delta_states[seg.slot] = run.state
    for seg in meta.prefills:
        if seg.verifies:
            out[seg.start:seg.end] = _verify(q, k, v, g, beta, seg, delta_states, tiled, ops,
                                             meta.kept)
    return out


def _verify(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor,
            beta: torch.Tensor, seg: RecurrentSegment, delta_states: torch.Tensor, tiled: bool,
            ops: KernelOps, kept: KeptStates) -> torch.Tensor:
    """A verifying run (a last token and its drafts) token by token on the decode step's
    kernel, the state after each kept: the numbers decoding each token would give, and on a
    CPU about 4x faster than the chunked rule for runs of 2 to 5 tokens (Qwen3.5's widths)."""
    slot = seg.slot
    if seg.fresh:
        delta_states[slot] = 0
    slots = torch.tensor([slot], device=v.device)
    after = delta_states.new_empty((seg.end - seg.start, *delta_states.shape[1:]))
    outputs = []
    for j, t in enumerate(range(seg.start, seg.end)):
        token = slice(t, t + 1)
        outputs.append(ops.gdn_step(delta_states, slots, q[token], k[token], v[token],
                                    g[token], beta[token], tiled))
        after[j] = delta_states[slot]
    kept.keep(delta_states, slot, after)
    return torch.cat(outputs)


def _chunk_for(length: int) -> int:
    """The delta rule's chunk for a run: CHUNK, or the power of two that holds a shorter run
    (a verifying run of a few tokens, padded to 64, would solve 64 x 64 systems)."""
    return min(CHUNK, 1 << max(length - 1, 0).bit_length())


def _l2_norm(x: torch.Tensor) -> torch.Tensor:
    return x * torch.rsqrt(x.pow(2).sum(-1, keepdim=True) + L2_EPS)
