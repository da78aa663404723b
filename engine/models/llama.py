"""The Llama family (Llama 2/3, SmolLM, Qwen2 with QKV bias, Qwen3, Mistral) on a paged KV cache."""

from __future__ import annotations

from collections.abc import MutableMapping
from dataclasses import dataclass

import torch
from transformers import PretrainedConfig

from engine.errors import ModelLoadError
from engine.layers.linear import (
    Linear,
    Placement,
    make_embedding,
    make_fused_linear,
    make_linear,
    to_device,
)
from engine.layers.lm_head import LMHead
from engine.models.config import head_dim
from engine.models.memory import release_freed_memory
from engine.models.native_decode import NativeDecode
from engine.models.rotary import RotaryTables
from engine.quantization.dequantize_workspace import DequantWorkspace
from engine.quantization.tensors import Weight, concat
from kernels.attention_metadata import AttentionMetadata, TritonAttentionMetadata


@dataclass(slots=True)
class LlamaLayer:
    input_norm: torch.Tensor
    qkv_proj: Linear  # q, k and v projections fused into one matmul
    o_proj: Linear
    post_attention_norm: torch.Tensor
    gate_up_proj: Linear  # gate and up fused
    down_proj: Linear
    # Qwen3 RMS-normalises every query and key head (over head_dim) before RoPE.
    q_norm: torch.Tensor | None = None
    k_norm: torch.Tensor | None = None

    def linears(self) -> list[Linear]:
        return [self.qkv_proj, self.o_proj, self.gate_up_proj, self.down_proj]


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
        return cls(config.num_hidden_layers, config.hidden_size, config.num_attention_heads,
                   getattr(config, "num_key_value_heads", None) or config.num_attention_heads,
                   head_dim(config), config.vocab_size, config.rms_norm_eps,
                   _sliding_window(config),
                   config.max_position_embeddings)


class LlamaForCausalLM:
    """Plain tensors and functions: no nn.Module, since per-call overhead is per-step cost here."""

    def __init__(self, config: PretrainedConfig, weights: MutableMapping[str, Weight],
                 placement: Placement, release_weights: bool = False) -> None:
        """release_weights: empty `weights` as the layers take them, so the loader's layout and
        the kernels' never both hold the whole model (a CPU int4 layer repacks its weight)."""
        self.shape = LlamaShape.from_config(config)
        self.ops = placement.ops
        s = self.shape
        device, dtype = placement.device, placement.dtype
        embed = weights["model.embed_tokens.weight"]
        self.embed_tokens = make_embedding(embed, placement)
        # A tied lm_head shares the embedding's tensors on the device, not a second copy.
        lm_head = weights.get("lm_head.weight", self.embed_tokens.weight)
        exact = None if isinstance(lm_head, torch.Tensor) else to_device(lm_head, device, dtype)
        widen = None if exact is None or device.type != "cpu" else DequantWorkspace.for_this_machine()
        self.lm_head = LMHead(make_linear(lm_head, None, placement, precise_int8=False), exact,
                              widen, placement.ops.top_k_indices)
        self.norm = weights["model.norm.weight"].to(device=device, dtype=dtype)
        self.layers = []
        for i in range(s.num_layers):
            prefix = f"model.layers.{i}."
            self.layers.append(_load_layer(weights, prefix, placement))
            if release_weights:
                for name in [n for n in weights if n.startswith(prefix)]:
                    del weights[name]
                release_freed_memory()
        if release_weights:
            weights.clear()
            release_freed_memory()
        self.rotary = RotaryTables(config, s.head_dim, s.max_position_embeddings, dtype, device)
        self.scale = s.head_dim ** -0.5
        self.native_decode = NativeDecode.build(self)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor,
                meta: AttentionMetadata | TritonAttentionMetadata,
                kv_caches: list[tuple[torch.Tensor, torch.Tensor]],
                logits_indices: torch.Tensor) -> torch.Tensor:
        """Flat tokens of a mixed batch -> logits [len(logits_indices), vocab]."""
        hidden = self.hidden_states(input_ids, positions, meta, kv_caches)
        # Only the rows that sample need the final norm and the (large) vocabulary projection.
        return self.compute_logits(hidden[logits_indices])

    def hidden_states(self, input_ids: torch.Tensor, positions: torch.Tensor,
                      meta: AttentionMetadata | TritonAttentionMetadata,
                      kv_caches: list[tuple[torch.Tensor, torch.Tensor]]) -> torch.Tensor:
        """Flat tokens of a mixed batch -> the last layer's output [tokens, hidden], before the
        final norm (valid until the next call: a decode step's may be a reused buffer)."""
        s, ops = self.shape, self.ops
        cos, sin = self.rotary.lookup(positions)
        hidden = self.embed_tokens(input_ids)
        if self.native_decode is not None:
            out = self.native_decode.forward_layers(hidden, cos, sin, meta, kv_caches)
            if out is not None:
                return out
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
            hidden = layer.down_proj(ops.silu_and_mul(layer.gate_up_proj(x)))
        return hidden + residual

    def final_norm(self, hidden: torch.Tensor) -> torch.Tensor:
        """The model's last RMSNorm: what lm_head reads, and what a pooling request averages."""
        return self.ops.rms_norm(hidden, self.norm, self.shape.rms_norm_eps)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """Rows of `hidden_states` -> their logits [rows, vocab]."""
        return self.lm_head(self.final_norm(hidden))

    def linears(self) -> list[Linear]:
        return [linear for layer in self.layers for linear in layer.linears()] + [self.lm_head.linear]

    def _attention(self, layer: LlamaLayer, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                   k_cache: torch.Tensor, v_cache: torch.Tensor,
                   meta: AttentionMetadata | TritonAttentionMetadata) -> torch.Tensor:
        s, ops = self.shape, self.ops
        n = x.shape[0]
        qkv = layer.qkv_proj(x)
        q_and_k = qkv[:, :(s.num_heads + s.num_kv_heads) * s.head_dim].view(n, -1, s.head_dim)
        if layer.q_norm is not None:
            q_and_k = self._norm_heads(layer, q_and_k)
        q_and_k = ops.rotary_embedding(q_and_k, cos, sin)
        q, k = q_and_k.split((s.num_heads, s.num_kv_heads), dim=1)
        v = qkv[:, (s.num_heads + s.num_kv_heads) * s.head_dim:].view(n, s.num_kv_heads, s.head_dim)
        attn = ops.paged_attention(q, k, v, k_cache, v_cache, meta, self.scale)
        return layer.o_proj(attn)

    def _norm_heads(self, layer: LlamaLayer, q_and_k: torch.Tensor) -> torch.Tensor:
        """Qwen3's per-head RMSNorm of [tokens, heads + kv_heads, head_dim] queries and keys."""
        s = self.shape
        q, k = q_and_k.split((s.num_heads, s.num_kv_heads), dim=1)
        # 2-D rows of head_dim: the shape every rms_norm backend takes.
        q = self.ops.rms_norm(q.reshape(-1, s.head_dim), layer.q_norm, s.rms_norm_eps)
        k = self.ops.rms_norm(k.reshape(-1, s.head_dim), layer.k_norm, s.rms_norm_eps)
        n = q_and_k.shape[0]
        return torch.cat((q.view(n, -1, s.head_dim), k.view(n, -1, s.head_dim)), dim=1)


def _load_layer(w: dict[str, Weight], prefix: str, placement: Placement) -> LlamaLayer:
    attn, mlp = prefix + "self_attn.", prefix + "mlp."
    device, dtype = placement.device, placement.dtype

    def linear(names: list[str]) -> Linear:
        bias = _fused(w, [name.replace(".weight", ".bias") for name in names])
        return make_fused_linear([w[name] for name in names], bias, placement)

    return LlamaLayer(
        input_norm=w[prefix + "input_layernorm.weight"].to(device=device, dtype=dtype),
        qkv_proj=linear([f"{attn}{p}_proj.weight" for p in "qkv"]),
        o_proj=linear([attn + "o_proj.weight"]),
        post_attention_norm=w[prefix + "post_attention_layernorm.weight"].to(device=device,
                                                                             dtype=dtype),
        gate_up_proj=linear([mlp + "gate_proj.weight", mlp + "up_proj.weight"]),
        down_proj=linear([mlp + "down_proj.weight"]),
        q_norm=_optional_norm(w, attn + "q_norm.weight", device, dtype),
        k_norm=_optional_norm(w, attn + "k_norm.weight", device, dtype),
    )


def _optional_norm(w: dict[str, Weight], name: str, device: torch.device,
                   dtype: torch.dtype) -> torch.Tensor | None:
    return w[name].to(device=device, dtype=dtype) if name in w else None


def _sliding_window(config: PretrainedConfig) -> int | None:
    """The one attention window all layers share, or None.

    Qwen2/3 configs name each layer's kind (`layer_types`, derived from `max_window_layers` when
    absent): Hugging Face windows only the "sliding_attention" layers.
    """
    window = getattr(config, "sliding_window", None)
    if not getattr(config, "use_sliding_window", True):
        window = None
    kinds = set(getattr(config, "layer_types", None) or [])
    if window is None or not kinds or kinds == {"sliding_attention"}:
        return window
    if "sliding_attention" not in kinds:
        return None
    raise ModelLoadError(
        f"This {config.model_type} model's config.json windows attention in some layers only "
        f"(sliding_window {window}, layer_types {config.layer_types}), which Pagoda does not "
        "run. Set use_sliding_window to false, or window every layer (max_window_layers 0).")


def _fused(w: dict[str, Weight], names: list[str]) -> Weight | None:
    """Concatenate projections that share an input into one matmul (None if absent)."""
    if names[0] not in w:
        return None
    return concat([w[n] for n in names]) if len(names) > 1 else w[names[0]]
