"""Self-attention over the paged KV cache, its kind set per layer: every key or a sliding window,
rotated by one of the model's rotary tables or not at all (NoPE), with optional per-head query
and key norms (Qwen3, Gemma 3), partial rotary (Phi-4-mini), Gemma 4's value norm and values
taken from the keys' projection, attention logit softcapping, attention sinks (gpt-oss), and an
output gate (Qwen3-Next, Qwen3.5)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from pagoda.engine.layers.linear import Linear
from pagoda.engine.quantization.tensors import Weight, select_rows
from pagoda.kernels.attention_metadata import AttentionMetadata, TritonAttentionMetadata
from pagoda.kernels.kernel_ops import KernelOps

# cos and signed sin of this step's positions, per rotary table (pagoda.engine.layers.rotary).
StepRotary = dict[str, tuple[torch.Tensor, torch.Tensor]]
Metadata = AttentionMetadata | TritonAttentionMetadata
StepKV = tuple[torch.Tensor, torch.Tensor]  # a step's keys and values [tokens, kv_heads, head_dim]


@dataclass(slots=True, frozen=True)
class HeadShape:
    num_heads: int
    num_kv_heads: int
    head_dim: int


@dataclass(slots=True)
class Attention:
    qkv_proj: Linear  # q, k and v in one matmul
    o_proj: Linear
    heads: HeadShape
    window: int  # 0: every key (pagoda.engine.models.architecture.FULL_ATTENTION)
    rope: str | None  # the rotary table's key; None: no RoPE
    scale: float
    eps: float
    q_norm: torch.Tensor | None = None
    k_norm: torch.Tensor | None = None
    # Gemma 4: values RMS-normed per head (a weight of ones: the norm has none), and on its
    # global layers the keys' projection as values (no v_proj: qkv_proj gives q and k only).
    v_norm: torch.Tensor | None = None
    values_from_keys: bool = False
    softcap: float | None = None  # scores capped at softcap * tanh(scores / softcap) (Gemma 2)
    sinks: torch.Tensor | None = None  # [heads] fp32 logits in each softmax's denominator (gpt-oss)
    # Qwen3-Next, Qwen3.5: qkv_proj also gives a gate per query channel, after everything else
    # (split_gated_queries), and the output is o_proj(attention * sigmoid(gate)).
    output_gate: bool = False

    def __call__(self, x: torch.Tensor, rotary: StepRotary, k_cache: torch.Tensor,
                 v_cache: torch.Tensor, meta: Metadata, ops: KernelOps,
                 shared: StepKV | None = None) -> tuple[torch.Tensor, StepKV]:
        """The attention's output and this step's keys and values. shared: those of the layer
        whose KV cache this one reads (Gemma 4's shared KV caches; qkv_proj then gives queries
        alone): they are written again to the same slots, then attended."""
        qkv = self.qkv_proj(x)
        gate = None
        if self.output_gate:
            width = self.heads.num_heads * self.heads.head_dim
            qkv, gate = qkv[:, :-width], qkv[:, -width:]
        if shared is None:
            q, k, v = self._queries_keys_values(qkv, rotary, ops)
        else:
            q, (k, v) = self._queries(qkv, rotary, ops), shared
        attn = ops.paged_attention(q, k, v, k_cache, v_cache, meta.for_window(self.window),
                                   self.scale, softcap=self.softcap, sinks=self.sinks)
        if gate is not None:
            attn = ops.sigmoid_mul(attn, gate)
        return self.o_proj(attn), (k, v)

    def _queries_keys_values(self, qkv: torch.Tensor, rotary: StepRotary, ops: KernelOps,
                             ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        h = self.heads
        qk_width = (h.num_heads + h.num_kv_heads) * h.head_dim
        v = self._values(qkv, qk_width, ops)
        q_and_k = qkv[:, :qk_width].view(qkv.shape[0], -1, h.head_dim)
        if self.q_norm is not None:
            q_and_k = self._norm_heads(q_and_k, ops)
        if self.rope is not None:
            cos, sin = rotary[self.rope]
            q_and_k = _rotate(q_and_k, cos, sin, ops)
        q, k = q_and_k.split((h.num_heads, h.num_kv_heads), dim=1)
        return q, k, v

    def _queries(self, q: torch.Tensor, rotary: StepRotary, ops: KernelOps) -> torch.Tensor:
        """[tokens, heads, head_dim] queries, normed and rotated, from q_proj's output alone."""
        h = self.heads
        if self.q_norm is not None:
            q = ops.rms_norm(q.reshape(-1, h.head_dim), self.q_norm, self.eps)
        q = q.view(-1, h.num_heads, h.head_dim)
        if self.rope is not None:
            cos, sin = rotary[self.rope]
            q = _rotate(q, cos, sin, ops)
        return q

    def _values(self, qkv: torch.Tensor, qk_width: int, ops: KernelOps) -> torch.Tensor:
        """[tokens, kv_heads, head_dim] values, taken before the keys are normed and rotated
        (which may be in place) where they are the keys' projection."""
        h = self.heads
        if self.values_from_keys:
            v = qkv[:, h.num_heads * h.head_dim:qk_width]
            if self.v_norm is None:
                v = v.clone()
        else:
            v = qkv[:, qk_width:]
        if self.v_norm is not None:
            v = ops.rms_norm(v.reshape(-1, h.head_dim), self.v_norm, self.eps)
        return v.view(qkv.shape[0], h.num_kv_heads, h.head_dim)

    def _norm_heads(self, q_and_k: torch.Tensor, ops: KernelOps) -> torch.Tensor:
        """Per-head RMSNorm of [tokens, heads + kv_heads, head_dim] queries and keys."""
        h = self.heads
        q, k = q_and_k.split((h.num_heads, h.num_kv_heads), dim=1)
        # 2-D rows of head_dim: the shape every rms_norm backend takes.
        q = ops.rms_norm(q.reshape(-1, h.head_dim), self.q_norm, self.eps)
        k = ops.rms_norm(k.reshape(-1, h.head_dim), self.k_norm, self.eps)
        n = q_and_k.shape[0]
        return torch.cat((q.view(n, -1, h.head_dim), k.view(n, -1, h.head_dim)), dim=1)


def split_gated_queries(q_proj: Weight, num_heads: int, head_dim: int) -> tuple[Weight, Weight]:
    """Hugging Face's gated q_proj [heads x 2 x head_dim, hidden] holds each head's query rows
    then its gate rows: (the queries' rows, the gates' rows), each heads in order, in the
    weight's own layout."""
    rows = (torch.arange(num_heads).unsqueeze(1) * 2 * head_dim + torch.arange(head_dim))
    return select_rows(q_proj, rows.flatten()), select_rows(q_proj, (rows + head_dim).flatten())


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
            ops: KernelOps) -> torch.Tensor:
    """RoPE on the first cos.shape[-1] dims of each head; the rest pass through."""
    rotary_dim = cos.shape[-1]
    if rotary_dim == x.shape[-1]:
        return ops.rotary_embedding(x, cos, sin)
    rotated = ops.rotary_embedding(x[..., :rotary_dim].contiguous(), cos, sin)
    return torch.cat((rotated, x[..., rotary_dim:]), dim=-1)
