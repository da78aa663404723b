"""The Llama family (Llama 2/3, SmolLM, Qwen2 with QKV bias, Mistral) over a paged KV cache."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from transformers import PretrainedConfig

from engine.loader import head_dim
from engine.models.rotary import RotaryTables
from kernels.attention_metadata import AttentionMetadata, TritonAttentionMetadata
from kernels.ops import TORCH_OPS, KernelOps


@dataclass(slots=True)
class LlamaLayer:
    input_norm: torch.Tensor
    qkv_weight: torch.Tensor  # q, k and v projections fused into one matmul
    qkv_bias: torch.Tensor | None
    o_weight: torch.Tensor
    o_bias: torch.Tensor | None
    post_attention_norm: torch.Tensor
    gate_up_weight: torch.Tensor  # gate and up fused
    gate_up_bias: torch.Tensor | None
    down_weight: torch.Tensor
    down_bias: torch.Tensor | None


@dataclass(slots=True, frozen=True)
class LlamaShape:
    num_layers: int
    hidden_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    vocab_size: int
    rms_norm_eps: float
    sliding_window: int | None
    max_position_embeddings: int

    @classmethod
    def from_config(cls, config: PretrainedConfig) -> LlamaShape:
        window = getattr(config, "sliding_window", None)
        if not getattr(config, "use_sliding_window", True):
            window = None
        return cls(config.num_hidden_layers, config.hidden_size, config.num_attention_heads,
                   getattr(config, "num_key_value_heads", None) or config.num_attention_heads,
                   head_dim(config), config.vocab_size, config.rms_norm_eps, window,
                   config.max_position_embeddings)


class LlamaForCausalLM:
    """Plain tensors and functions: no nn.Module, since per-call overhead is per-step cost here."""

    def __init__(self, config: PretrainedConfig, weights: dict[str, torch.Tensor],
                 device: torch.device, dtype: torch.dtype, ops: KernelOps = TORCH_OPS) -> None:
        self.shape = LlamaShape.from_config(config)
        self.ops = ops
        s = self.shape
        w = {k: v.to(device=device, dtype=dtype) for k, v in weights.items()}
        self.embed_tokens = w["model.embed_tokens.weight"]
        self.lm_head = w.get("lm_head.weight", self.embed_tokens)
        self.norm = w["model.norm.weight"]
        self.layers = [_load_layer(w, f"model.layers.{i}.") for i in range(s.num_layers)]
        self.rotary = RotaryTables(config, s.head_dim, s.max_position_embeddings, dtype, device)
        self.scale = s.head_dim ** -0.5

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor,
                meta: AttentionMetadata | TritonAttentionMetadata,
                kv_caches: list[tuple[torch.Tensor, torch.Tensor]],
                logits_indices: torch.Tensor) -> torch.Tensor:
        """Flat tokens of a mixed batch -> logits [len(logits_indices), vocab]."""
        s, ops = self.shape, self.ops
        cos, sin = self.rotary.lookup(positions)
        hidden = F.embedding(input_ids, self.embed_tokens)
        residual = None
        for layer, (k_cache, v_cache) in zip(self.layers, kv_caches, strict=True):
            if residual is None:
                residual = hidden
                x = ops.rms_norm(hidden, layer.input_norm, s.rms_norm_eps)
            else:
                x, residual = ops.add_rms_norm(hidden, residual, layer.input_norm, s.rms_norm_eps)
            hidden = self._attention(layer, x, cos, sin, k_cache, v_cache, meta)
            x, residual = ops.add_rms_norm(hidden, residual, layer.post_attention_norm,
                                           s.rms_norm_eps)
            gate_up = F.linear(x, layer.gate_up_weight, layer.gate_up_bias)
            hidden = F.linear(ops.silu_and_mul(gate_up), layer.down_weight, layer.down_bias)
        # Only the rows that sample need the final norm and the (large) vocabulary projection.
        hidden = (hidden + residual)[logits_indices]
        return F.linear(ops.rms_norm(hidden, self.norm, s.rms_norm_eps), self.lm_head)

    def _attention(self, layer: LlamaLayer, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                   k_cache: torch.Tensor, v_cache: torch.Tensor,
                   meta: AttentionMetadata | TritonAttentionMetadata) -> torch.Tensor:
        s, ops = self.shape, self.ops
        n = x.shape[0]
        qkv = F.linear(x, layer.qkv_weight, layer.qkv_bias)
        q_and_k = qkv[:, :(s.num_heads + s.num_kv_heads) * s.head_dim].view(n, -1, s.head_dim)
        q_and_k = ops.rotary_embedding(q_and_k, cos, sin)
        q, k = q_and_k.split((s.num_heads, s.num_kv_heads), dim=1)
        v = qkv[:, (s.num_heads + s.num_kv_heads) * s.head_dim:].view(n, s.num_kv_heads, s.head_dim)
        attn = ops.paged_attention(q, k, v, k_cache, v_cache, meta, self.scale)
        return F.linear(attn, layer.o_weight, layer.o_bias)


def _load_layer(w: dict[str, torch.Tensor], prefix: str) -> LlamaLayer:
    attn, mlp = prefix + "self_attn.", prefix + "mlp."
    return LlamaLayer(
        input_norm=w[prefix + "input_layernorm.weight"],
        qkv_weight=_fused(w, [f"{attn}{p}_proj.weight" for p in "qkv"]),
        qkv_bias=_fused(w, [f"{attn}{p}_proj.bias" for p in "qkv"]),
        o_weight=w[attn + "o_proj.weight"],
        o_bias=w.get(attn + "o_proj.bias"),
        post_attention_norm=w[prefix + "post_attention_layernorm.weight"],
        gate_up_weight=_fused(w, [mlp + "gate_proj.weight", mlp + "up_proj.weight"]),
        gate_up_bias=_fused(w, [mlp + "gate_proj.bias", mlp + "up_proj.bias"]),
        down_weight=w[mlp + "down_proj.weight"],
        down_bias=w.get(mlp + "down_proj.bias"),
    )


def _fused(w: dict[str, torch.Tensor], names: list[str]) -> torch.Tensor | None:
    """Concatenate projections that share an input into one matmul (None if absent)."""
    if names[0] not in w:
        return None
    return torch.cat([w[n] for n in names])
