"""What a decoder-only model family is made of, as data: every family module
(pagoda/engine/models/llama.py, gemma3.py, ...) reads its config.json into a `DecoderArchitecture`, and
one decoder (pagoda/engine/models/decoder.py) builds and runs any of them from shared layers.

Weights keep Hugging Face's parameter names; `LayerNames` says which of a layer's names fills
each role, so a GGUF file (whose names the loader maps to Hugging Face's) and a folder load the
same way.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from pagoda.engine.layers.rotary import RopeSpec

FULL_ATTENTION = 0  # an AttentionKind's window when a query sees every earlier key


@dataclass(frozen=True, slots=True)
class AttentionKind:
    """One layer's attention: `window` keys back (the query's own included), or every key when
    FULL_ATTENTION; rotated by the model's table `rope` (a key of `DecoderArchitecture.ropes`),
    or not at all when None (NoPE)."""

    window: int = FULL_ATTENTION
    rope: str | None = "default"
    # Values are the keys' projection (Gemma 4's global layers: attention_k_eq_v), read before
    # the key norm and RoPE; the layer has no v_proj.
    values_from_keys: bool = False
    # Qwen3-Next's and Qwen3.5's gated attention: q_proj holds each head's query rows then its
    # gate rows, and the output is o_proj(attention * sigmoid(gate)).
    output_gate: bool = False


@dataclass(frozen=True, slots=True)
class ShortConvKind:
    """A recurrent layer in place of attention: LFM2's gated short convolution. `module` (within
    model.layers.N.) holds in_proj (hidden -> B, C, x), conv (depthwise, `kernel` taps over the
    sequence, no activation) and out_proj: out_proj(C * conv(B * x)). Each sequence carries the
    last kernel-1 inputs of its convolution from step to step (a state slot, not KV blocks)."""

    kernel: int
    bias: bool = False
    module: str = "conv"


@dataclass(frozen=True, slots=True)
class Mamba2Kind:
    """A recurrent layer in place of attention: a Mamba-2 mixer (Granite 4's "mamba" layers,
    pagoda/engine/layers/mamba2.py). `module` (within model.layers.N.) holds in_proj (hidden ->
    gate z, x|B|C, a time step per head), conv1d (depthwise over x|B|C, `conv_kernel` taps, then
    SiLU), A_log, D, dt_bias, the gated norm (norm.weight) and out_proj. Each sequence carries the
    convolution's last conv_kernel-1 inputs and a state of heads x head_dim x state_size.
    chunk_size: config.json's scan chunk (a GPU kernel's tile; the decoder picks a CPU's own)."""

    num_heads: int
    head_dim: int
    state_size: int
    n_groups: int
    conv_kernel: int
    chunk_size: int
    time_step_limit: tuple[float, float]
    conv_bias: bool = True
    proj_bias: bool = False
    module: str = "mamba"

    @property
    def inner_size(self) -> int:
        return self.num_heads * self.head_dim

    @property
    def conv_channels(self) -> int:
        return self.inner_size + 2 * self.n_groups * self.state_size

    @property
    def state_floats(self) -> int:
        """One sequence's state in this layer: the convolution's window and the SSM state."""
        return (self.conv_channels * (self.conv_kernel - 1)
                + self.num_heads * self.head_dim * self.state_size)


@dataclass(frozen=True, slots=True)
class GatedDeltaNetKind:
    """A recurrent layer in place of attention: Gated DeltaNet (Qwen3-Next's and Qwen3.5's
    linear-attention layers, pagoda/engine/layers/gated_delta_net.py). `module` (within
    model.layers.N.) holds the input projections (`layout`: "qwen3_5"'s in_proj_qkv, in_proj_z,
    in_proj_b, in_proj_a; "qwen3_next"'s in_proj_qkvz and in_proj_ba grouped by key head; or
    "qwen3_next_split", a qwen3next GGUF file's in_proj_qkv, in_proj_z and in_proj_ba),
    conv1d (depthwise over q|k|v, `conv_kernel` taps, then SiLU), A_log, dt_bias, the gated norm
    and out_proj. Each sequence carries the convolution's last conv_kernel-1 inputs and a
    [v_heads, k_dim, v_dim] state. tiled: value head h reads key head h % k_heads (llama.cpp's
    converter's order) instead of h // (v_heads / k_heads)."""

    num_k_heads: int
    num_v_heads: int
    k_dim: int
    v_dim: int
    conv_kernel: int
    layout: str = "qwen3_5"
    tiled: bool = False
    module: str = "linear_attn"

    @property
    def conv_channels(self) -> int:
        return 2 * self.num_k_heads * self.k_dim + self.num_v_heads * self.v_dim

    @property
    def state_floats(self) -> int:
        """One sequence's state in this layer: the convolution's window and the delta rule's."""
        return (self.conv_channels * (self.conv_kernel - 1)
                + self.num_v_heads * self.k_dim * self.v_dim)


# What a layer mixes its tokens with: attention over the KV cache, or a recurrent mixer.
LayerKind = AttentionKind | ShortConvKind | Mamba2Kind | GatedDeltaNetKind


def recurrent_state_floats(layers: Iterable[LayerKind], hidden: int) -> int:
    """One sequence's states over these layers, in floats: a short convolution's last kernel-1
    inputs, a Mamba-2 layer's window and SSM state (what the mixers' state_shapes() hold)."""
    floats = 0
    for kind in layers:
        if isinstance(kind, ShortConvKind):
            floats += hidden * (kind.kernel - 1)
        elif isinstance(kind, Mamba2Kind | GatedDeltaNetKind):
            floats += kind.state_floats
    return floats


@dataclass(frozen=True, slots=True)
class LayerNames:
    """The Hugging Face module names (within model.layers.N.) that fill each role. A tuple of
    several names is concatenated into one matmul; a single fused name is read as it is (Phi-3's
    qkv_proj). Norms that a family lacks are None."""

    qkv: tuple[str, ...] = ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj")
    o: str = "self_attn.o_proj"
    gate_up: tuple[str, ...] = ("mlp.gate_proj", "mlp.up_proj")
    down: str = "mlp.down_proj"
    input_norm: str = "input_layernorm"
    # "Sandwich" norms (Gemma): on the attention's output and the MLP's, before each residual add.
    attention_out_norm: str | None = None
    mlp_norm: str = "post_attention_layernorm"
    mlp_out_norm: str | None = None
    # Per-head RMSNorm of queries and keys before RoPE (Qwen3, Gemma 3).
    q_norm: str | None = None
    k_norm: str | None = None
    # A scalar the layer's output is multiplied by (Gemma 4's layer_scalar; a parameter without
    # a ".weight" suffix).
    layer_scalar: str | None = None
    # Attention sinks (gpt-oss's self_attn.sinks, no ".weight" suffix either): a logit per query
    # head that joins the softmax's denominator and weighs no value.
    sinks: str | None = None
    # Per-layer embeddings (Gemma 4's E2B/E4B): the layer's output through a gate to the
    # per-layer width, times the token's per-layer input, projected back and normed, added.
    per_layer_gate: str | None = None
    per_layer_projection: str | None = None
    per_layer_norm: str | None = None


@dataclass(frozen=True, slots=True)
class ModelShape:
    num_layers: int
    hidden_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    vocab_size: int
    rms_norm_eps: float
    max_position_embeddings: int
    intermediate_size: int
    # Each layer's attention window (FULL_ATTENTION for none), in layer order.
    layer_windows: tuple[int, ...]
    # Each layer's (KV heads, head size) where layers differ (Gemma 4's global layers have
    # their own); empty where every layer has num_kv_heads heads of head_dim.
    layer_heads: tuple[tuple[int, int], ...] = ()
    # Each layer's KV cache: its own (its index) or an earlier layer's, whose keys and values it
    # reads and does not write (Gemma 4's E2B/E4B: the last layers share); empty: all its own.
    layer_kv_from: tuple[int, ...] = ()
    # Each layer's MLP width where layers differ (Gemma 4's double-wide MLPs); empty: all
    # intermediate_size.
    layer_intermediate: tuple[int, ...] = ()
    # The layers that mix tokens with a recurrent state instead of attention (LFM2's short
    # convolutions): they hold no KV cache, and their entry in layer_windows is not read.
    recurrent_layers: frozenset[int] = frozenset()
    # One sequence's states over every recurrent layer, in floats (float32): what its slot
    # takes (`recurrent_state_floats`); 0 without recurrent layers.
    state_floats: int = 0

    @property
    def windows(self) -> tuple[int, ...]:
        """The distinct windows of the attention layers, FULL_ATTENTION first where one has it."""
        return tuple(sorted({w for i, w in enumerate(self.layer_windows)
                             if i not in self.recurrent_layers}))

    def holds_kv(self, layer: int) -> bool:
        """Whether the layer keeps a KV cache of its own: an attention layer that does not read
        an earlier layer's."""
        return layer not in self.recurrent_layers and self.kv_owner(layer) == layer

    def kv_heads(self, layer: int) -> tuple[int, int]:
        """Layer `layer`'s (KV heads, head size): what its KV cache holds per token."""
        return self.layer_heads[layer] if self.layer_heads else (self.num_kv_heads,
                                                                 self.head_dim)

    def kv_floats(self, layers: Iterable[int]) -> int:
        """Keys' (or values') floats per token over these layers' own KV caches."""
        return sum(heads * size for heads, size in map(self.kv_heads, layers))

    def kv_owner(self, layer: int) -> int:
        """The layer whose KV cache `layer` reads: itself, or the earlier one it shares."""
        return self.layer_kv_from[layer] if self.layer_kv_from else layer

    def intermediate(self, layer: int) -> int:
        return self.layer_intermediate[layer] if self.layer_intermediate else self.intermediate_size


# The names of a sparse (mixture-of-experts) layer's weights within model.layers.N., whatever
# the family or the file: a folder's or a GGUF file's own names are mapped to these at load.
ROUTER = "mlp.gate"
EXPERTS = "mlp.experts"  # expert e: mlp.experts.{e}.gate_proj / up_proj / down_proj
SHARED_EXPERT = "mlp.shared_expert"  # its gate_proj / up_proj / down_proj
SHARED_EXPERT_GATE = "mlp.shared_expert_gate"
EXPERT_MODULES = ("gate_proj", "up_proj", "down_proj")


@dataclass(frozen=True, slots=True)
class MoESpec:
    """A mixture-of-experts model's sparse MLPs: a router scores `num_experts` experts per
    token, the token goes through its `top_k` best (each a gated MLP `intermediate_size`
    wide) and their outputs are added, weighted by the scores; plus a shared expert every
    token goes through, where the model has one. Layers not in `sparse_layers` keep a dense
    MLP of the shape's intermediate size."""

    num_experts: int
    top_k: int
    intermediate_size: int
    sparse_layers: frozenset[int]
    scoring: str = "softmax"  # of the router's logits: "softmax" or "sigmoid"
    renormalize: bool = False  # the top-k weights scaled to sum to 1 (norm_topk_prob)
    # gpt-oss: the top k chosen by raw logit, their weights a softmax over those k alone.
    softmax_after_top_k: bool = False
    router_bias: bool = False
    expert_bias: bool = False  # gate, up and down of every expert (gpt-oss)
    shared_expert_size: int = 0  # the shared expert's width (0: none; Qwen2-MoE has one)
    shared_expert_gate: bool = False  # its output times sigmoid(a [1, hidden] projection)
    activation: str = "silu"  # "silu" (SwiGLU) or gpt-oss's clamped "swiglu_oai"
    swiglu_limit: float | None = None  # swiglu_oai's clamp of gate and up
    swiglu_alpha: float | None = None  # swiglu_oai's gate * sigmoid(alpha * gate)

    def __post_init__(self) -> None:
        if not 0 < self.top_k <= self.num_experts:
            raise ValueError(f"top {self.top_k} of {self.num_experts} experts")

    def is_sparse(self, layer: int) -> bool:
        return layer in self.sparse_layers


def sparse_layers(num_layers: int, every: int = 1,
                  dense: Iterable[int] = ()) -> frozenset[int]:
    """Hugging Face's rule (Qwen2/3-MoE's decoder_sparse_step and mlp_only_layers): layer i is
    sparse when i + 1 is a multiple of `every` and i is not in `dense`."""
    return frozenset(i for i in range(num_layers) if (i + 1) % every == 0) - set(dense)


@dataclass(frozen=True, slots=True)
class DecoderArchitecture:
    family: str  # the family module's name, as the load log and errors say it ("Gemma 3")
    shape: ModelShape
    layers: tuple[LayerKind, ...]
    ropes: dict[str, RopeSpec]
    names: LayerNames = field(default_factory=LayerNames)
    attention_scale: float | None = None  # None: head_dim ** -0.5
    # Gemma's norms scale by (1 + w): added to every norm weight of a Hugging Face folder at load.
    norm_offset: float = 0.0
    activation: str = "silu"  # of the gated MLP: "silu" (SwiGLU) or "gelu_tanh" (GeGLU)
    embedding_scale: float | None = None  # Gemma multiplies embeddings by sqrt(hidden)
    attention_softcap: float | None = None  # cap * tanh(scores / cap) before the softmax
    value_norm: bool = False  # Gemma 4: values RMS-normed per head, without a weight
    per_layer_input: int = 0  # Gemma 4's per-layer embeddings: their width per layer (0: none)
    final_softcap: float | None = None  # the same on the logits
    tied_embeddings: bool = True  # lm_head reads the token table
    qkv_bias: bool = False
    o_bias: bool = False
    mlp_bias: bool = False
    moe: MoESpec | None = None  # a mixture of experts: which layers are sparse, and how
    final_norm: str = "model.norm"  # the last norm's module (LFM2: model.embedding_norm)
    # Granite: each mixer's and MLP's output times this before it joins the residual stream
    # (residual_multiplier), and the logits divided by logit_divisor (logits_scaling).
    residual_scale: float | None = None
    logit_divisor: float | None = None
    # A family whose files may carry a multi-token-prediction block (Qwen3.5, Qwen3-Next:
    # pagoda/engine/models/mtp.py): the main layer whose shape the block's decoder layer has
    # (a full-attention one). None: the family has no such block.
    mtp_like: int | None = None

    def __post_init__(self) -> None:
        if len(self.layers) != self.shape.num_layers:
            raise ValueError(f"{len(self.layers)} attention kinds for "
                             f"{self.shape.num_layers} layers")
        recurrent = frozenset(i for i, kind in enumerate(self.layers)
                              if not isinstance(kind, AttentionKind))
        if recurrent != self.shape.recurrent_layers:
            raise ValueError(f"layers {sorted(recurrent)} are recurrent, the shape says "
                             f"{sorted(self.shape.recurrent_layers)}")
        floats = recurrent_state_floats(self.layers, self.shape.hidden_size)
        if floats != self.shape.state_floats:
            raise ValueError(f"the recurrent layers' states take {floats} floats a sequence, "
                             f"the shape says {self.shape.state_floats}")

    def is_recurrent(self, layer: int) -> bool:
        """Whether layer `layer` mixes tokens with a recurrent state instead of attention."""
        return layer in self.shape.recurrent_layers

    @property
    def has_recurrent_layers(self) -> bool:
        return bool(self.shape.recurrent_layers)

    def is_sparse(self, layer: int) -> bool:
        """Whether layer `layer`'s MLP is a mixture of experts."""
        return self.moe is not None and self.moe.is_sparse(layer)

    @property
    def scale(self) -> float:
        return self.attention_scale or self.shape.head_dim ** -0.5
