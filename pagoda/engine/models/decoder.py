"""A decoder-only transformer on a paged KV cache, built from a family's `DecoderArchitecture`
(pagoda/engine/models/architecture.py) and the shared layers of pagoda/engine/layers/.

Plain tensors and functions, no nn.Module: per-call overhead is per-step cost here.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, MutableMapping
from dataclasses import dataclass

import torch
from transformers import PretrainedConfig

from pagoda.engine.layers.attention import (
    Attention,
    HeadShape,
    Metadata,
    StepKV,
    split_gated_queries,
)
from pagoda.engine.layers.gated_delta_net import DeltaNetShape, GatedDeltaNet
from pagoda.engine.layers.gated_delta_net_weights import (
    qwen3_5_gated_delta_net,
    qwen3_next_gated_delta_net,
    qwen3_next_split_gated_delta_net,
)
from pagoda.engine.layers.linear import (
    Embedding,
    Linear,
    Placement,
    make_embedding,
    make_fused_linear,
    make_linear,
    to_device,
)
from pagoda.engine.layers.lm_head import LMHead
from pagoda.engine.layers.mamba2 import Mamba2Config, Mamba2Mixer
from pagoda.engine.layers.mlp import GatedMLP, activation_and_mul
from pagoda.engine.layers.moe import (
    ExpertActivation,
    ExpertWeights,
    Router,
    SparseMoE,
    experts_method_for,
)
from pagoda.engine.layers.recurrent_mixer import RecurrentMixer
from pagoda.engine.layers.rotary import RotaryTables
from pagoda.engine.layers.short_conv import ShortConv
from pagoda.engine.models.architecture import (
    EXPERT_MODULES,
    EXPERTS,
    ROUTER,
    SHARED_EXPERT,
    SHARED_EXPERT_GATE,
    AttentionKind,
    DecoderArchitecture,
    GatedDeltaNetKind,
    Mamba2Kind,
    ShortConvKind,
)
from pagoda.engine.models.config import qkv_modules
from pagoda.engine.models import mtp
from pagoda.engine.models.memory import release_freed_memory
from pagoda.engine.models.mtp import MultiTokenPredictor
from pagoda.engine.models.native_decode import NativeDecode, not_covered
from pagoda.engine.quantization.dequantize_workspace import DequantWorkspace
from pagoda.engine.quantization.tensors import Weight, concat
from pagoda.kernels.kernel_ops import KernelOps
from pagoda.kernels.recurrent_metadata import RecurrentMetadata

logger = logging.getLogger(__name__)

# The Mamba-2 scan's chunk on a CPU: config.json's (256) is a GPU kernel's tile; 64 ran the scan
# 2.3-2.7x faster at Granite 4's widths, as accurately (pagoda/engine/layers/mamba2.py).
CPU_SCAN_CHUNK = 64


@dataclass(slots=True)
class PerLayerInput:
    """A layer's use of its per-layer input (Gemma 4's E2B/E4B): its output through `gate` to
    the per-layer width, the MLP's activation, times the token's input for this layer, back
    through `projection`, normed, added to the output."""

    gate: Linear
    projection: Linear
    norm: torch.Tensor
    activation: str

    def __call__(self, hidden: torch.Tensor, per_layer_input: torch.Tensor, ops: KernelOps,
                 eps: float) -> torch.Tensor:
        gate_and_input = torch.cat((self.gate(hidden), per_layer_input), dim=-1)
        gated = activation_and_mul(gate_and_input, self.activation, ops)
        return hidden + ops.rms_norm(self.projection(gated), self.norm, eps)


@dataclass(slots=True)
class PerLayerEmbeddings:
    """Each token's input to every layer (Gemma 4's E2B/E4B): its row of a token table of
    layers x width, beside the embedding projected to the same and normed per layer, averaged
    (their sum times 1/sqrt(2), as transformers computes it)."""

    table: Embedding
    table_scale: float  # sqrt(width), in the compute dtype
    projection: Linear
    projection_scale: float  # 1 / sqrt(hidden)
    norm: torch.Tensor
    num_layers: int
    width: int

    def __call__(self, input_ids: torch.Tensor, embeddings: torch.Tensor, ops: KernelOps,
                 eps: float) -> torch.Tensor:
        """[tokens] ids and their scaled embeddings -> [tokens, layers, width]."""
        shape = (input_ids.shape[0], self.num_layers, self.width)
        tokens = (self.table(input_ids) * self.table_scale).view(shape)
        projected = self.projection(embeddings) * self.projection_scale
        projected = ops.rms_norm(projected.reshape(-1, self.width), self.norm, eps).view(shape)
        return (projected + tokens) * 2.0 ** -0.5


@dataclass(slots=True)
class RecurrentStep:
    """A step's inputs to the recurrent layers: each sequence's state slot, and per layer its
    state tensors (None at attention layers), which the layers advance in place."""

    meta: RecurrentMetadata
    states: list[tuple[torch.Tensor, ...] | None]


@dataclass(slots=True)
class DecoderLayer:
    input_norm: torch.Tensor
    attention: Attention | None  # None where a recurrent mixer takes its place
    mlp_norm: torch.Tensor  # Llama's post_attention_layernorm, Gemma's pre_feedforward one
    mlp: GatedMLP | SparseMoE
    attention_out_norm: torch.Tensor | None = None  # Gemma's sandwich norms
    mlp_out_norm: torch.Tensor | None = None
    scalar: torch.Tensor | None = None  # Gemma 4: the layer's output times this
    per_layer: PerLayerInput | None = None  # Gemma 4's E2B/E4B
    kv_from: int | None = None  # the earlier layer whose KV cache this one reads (Gemma 4)
    mixer: RecurrentMixer | None = None  # in place of attention (LFM2's short convolution)
    mixer_projections: tuple[Linear, ...] = ()  # the mixer's linears, its input's first

    # The names the one-C-call decode step (native_decode.py) reads (attention layers only).
    @property
    def qkv_proj(self) -> Linear:
        return self.attention.qkv_proj

    @property
    def o_proj(self) -> Linear:
        return self.attention.o_proj

    @property
    def gate_up_proj(self) -> Linear:
        return self.mlp.gate_up_proj

    @property
    def down_proj(self) -> Linear:
        return self.mlp.down_proj

    def mixer_linears(self) -> list[Linear]:
        """The linears that mix tokens: q/k/v and o, or the recurrent mixer's, input first."""
        if self.mixer is not None:
            return list(self.mixer_projections)
        return [self.qkv_proj, self.o_proj]

    def linears(self) -> list[Linear]:
        """The layer's linears; a sparse layer's router and shared expert, not its routed
        experts (their `ExpertsMethod` keeps them)."""
        if isinstance(self.mlp, GatedMLP):
            return [*self.mixer_linears(), self.gate_up_proj, self.down_proj]
        shared = [] if self.mlp.shared is None else [self.mlp.shared.gate_up_proj,
                                                     self.mlp.shared.down_proj]
        gate = [] if self.mlp.shared_gate is None else [self.mlp.shared_gate]
        return [*self.mixer_linears(), self.mlp.router.gate, *shared, *gate]


class DecoderForCausalLM:
    def __init__(self, arch: DecoderArchitecture, config: PretrainedConfig,
                 weights: MutableMapping[str, Weight], placement: Placement,
                 release_weights: bool = False, with_mtp: bool = False) -> None:
        """release_weights: empty `weights` as the layers take them, so the loader's layout and
        the kernels' never both hold the whole model (a CPU int4 layer repacks its weight).
        with_mtp: build the multi-token-prediction block where the weights have one (`mtp`,
        else None), for drafts."""
        self.arch = arch
        self.shape = s = arch.shape
        self.ops = placement.ops
        device, dtype = placement.device, placement.dtype
        self.embed_tokens = make_embedding(weights["model.embed_tokens.weight"], placement)
        self.embedding_scale = (None if arch.embedding_scale is None
                                else torch.tensor(arch.embedding_scale, dtype=dtype).item())
        # A tied lm_head shares the embedding's tensors on the device, not a second copy.
        lm_head = weights.get("lm_head.weight", self.embed_tokens.weight)
        exact = None if isinstance(lm_head, torch.Tensor) else to_device(lm_head, device, dtype)
        widen = None if exact is None or device.type != "cpu" else DequantWorkspace.for_this_machine()
        self.lm_head = LMHead(make_linear(lm_head, None, placement, precise_int8=False), exact,
                              widen, placement.ops.top_k_indices)
        self.norm = self._norm(weights[f"{arch.final_norm}.weight"], placement)
        self.per_layer_embeddings = self._per_layer_embeddings(weights, placement)
        # Layers whose keys and values later layers read in the same step (Gemma 4).
        self.kv_sources = {s.kv_owner(i) for i in range(s.num_layers) if s.kv_owner(i) != i}
        self.layers = []
        for i in range(s.num_layers):
            prefix = f"model.layers.{i}."
            self.layers.append(self._load_layer(weights, i, placement))
            if release_weights:
                for name in [n for n in weights if n.startswith(prefix)]:
                    del weights[name]
                release_freed_memory()
        self.mtp = self._multi_token_predictor(weights, placement) if with_mtp else None
        if release_weights:
            weights.clear()
            release_freed_memory()
        self.rotary = {key: RotaryTables(config, spec, s.max_position_embeddings, dtype, device)
                       for key, spec in arch.ropes.items()}
        self.scale = arch.scale
        self.residual_scale = (None if arch.residual_scale is None
                               else torch.tensor(arch.residual_scale, dtype=dtype).item())
        self.native_decode = NativeDecode.build(self)
        uncovered = not_covered(arch)
        if uncovered is not None and self.ops.decode_layers is not None:
            logger.info("%s: decode steps run layer by layer (the one-call C decode step does "
                        "not run %s)", arch.family, uncovered)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, meta: Metadata,
                kv_caches: list[tuple[torch.Tensor, torch.Tensor] | None],
                logits_indices: torch.Tensor, recurrent: RecurrentStep | None = None,
                inserted: tuple[torch.Tensor, torch.Tensor] | None = None) -> torch.Tensor:
        """Flat tokens of a mixed batch -> logits [len(logits_indices), vocab]."""
        hidden = self.hidden_states(input_ids, positions, meta, kv_caches, recurrent, inserted)
        # Only the rows that sample need the final norm and the (large) vocabulary projection.
        return self.compute_logits(hidden[logits_indices])

    def hidden_states(self, input_ids: torch.Tensor, positions: torch.Tensor, meta: Metadata,
                      kv_caches: list[tuple[torch.Tensor, torch.Tensor] | None],
                      recurrent: RecurrentStep | None = None,
                      inserted: tuple[torch.Tensor, torch.Tensor] | None = None) -> torch.Tensor:
        """Flat tokens of a mixed batch -> the last layer's output [tokens, hidden], before the
        final norm (valid until the next call: a decode step's may be a reused buffer).
        kv_caches: each attention layer's keys and values (None at a recurrent layer);
        recurrent: the step's state slots and states, where the model has recurrent layers;
        inserted: (rows, embeddings) that replace those rows' token embeddings (an image's
        placeholders), after the embedding scale, which they do not take."""
        rotary = {key: tables.lookup(positions) for key, tables in self.rotary.items()}
        hidden = self.embed_tokens(input_ids)
        if self.embedding_scale is not None:
            hidden = hidden * self.embedding_scale
        if inserted is not None:
            rows, embeddings = inserted
            hidden = hidden.index_copy(0, rows, embeddings.to(hidden.dtype))
        if self.native_decode is not None:
            out = self.native_decode.forward_layers(hidden, rotary, meta, kv_caches, recurrent)
            if out is not None:
                return out
        residual = None
        eps, ops = self.shape.rms_norm_eps, self.ops
        per_layer_inputs = (None if self.per_layer_embeddings is None
                            else self.per_layer_embeddings(input_ids, hidden, ops, eps))
        step_kv: dict[int, StepKV] = {}  # the keys and values later layers read (kv_from)
        for i, (layer, kv_cache) in enumerate(zip(self.layers, kv_caches, strict=True)):
            if residual is None:
                residual = hidden
                x = ops.rms_norm(hidden, layer.input_norm, eps)
            else:
                x, residual = ops.add_rms_norm(hidden, residual, layer.input_norm, eps)
            if layer.mixer is not None:
                hidden = layer.mixer.forward(x, recurrent.meta, recurrent.states[i], ops)
            else:
                k_cache, v_cache = kv_cache
                hidden, kv = layer.attention(
                    x, rotary, k_cache, v_cache, meta, ops,
                    None if layer.kv_from is None else step_kv[layer.kv_from])
                if i in self.kv_sources:
                    step_kv[i] = kv
            if self.residual_scale is not None:
                hidden = hidden * self.residual_scale
            if layer.attention_out_norm is not None:
                hidden = ops.rms_norm(hidden, layer.attention_out_norm, eps)
            x, residual = ops.add_rms_norm(hidden, residual, layer.mlp_norm, eps)
            hidden = layer.mlp(x, ops)
            if self.residual_scale is not None:
                hidden = hidden * self.residual_scale
            if layer.mlp_out_norm is not None:
                hidden = ops.rms_norm(hidden, layer.mlp_out_norm, eps)
            if layer.per_layer is not None or layer.scalar is not None:
                # The layer's whole output goes on: the next layer starts a residual afresh.
                hidden, residual = hidden + residual, None
            if layer.per_layer is not None:
                hidden = layer.per_layer(hidden, per_layer_inputs[:, i], ops, eps)
            if layer.scalar is not None:
                hidden = hidden * layer.scalar
        return hidden if residual is None else hidden + residual

    def final_norm(self, hidden: torch.Tensor) -> torch.Tensor:
        """The model's last RMSNorm: what lm_head reads, and what a pooling request averages."""
        return self.ops.rms_norm(hidden, self.norm, self.shape.rms_norm_eps)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """Rows of `hidden_states` -> their logits [rows, vocab]."""
        logits = self.lm_head(self.final_norm(hidden))
        if self.arch.logit_divisor is not None:
            logits = logits.div_(self.arch.logit_divisor)
        cap = self.arch.final_softcap
        if cap is not None:
            logits = torch.tanh(logits.div_(cap)).mul_(cap)
        return logits

    def linears(self) -> list[Linear]:
        return [linear for layer in self.layers for linear in layer.linears()] + [self.lm_head.linear]

    def mlp_floats_per_row(self) -> int:
        """A bound on the floats one token's MLP holds at once, in its widest layer: gate and
        up and their product; in a sparse layer, for each of its k experts, its copy of the
        input, gate and up, and output, and the shared expert's."""
        s, moe = self.shape, self.arch.moe
        dense = [2 * 2 * s.intermediate(i) for i in range(s.num_layers)
                 if not self.arch.is_sparse(i)]
        sparse = ([] if moe is None else
                  [2 * moe.top_k * (2 * moe.intermediate_size + 2 * s.hidden_size)
                   + 2 * 2 * moe.shared_expert_size])
        return max(dense + sparse)

    def _norm(self, weight: Weight, placement: Placement) -> torch.Tensor:
        if not self.arch.norm_offset:
            return weight.to(device=placement.device, dtype=placement.dtype)
        # Exact in float64, rounded once: fp32's 1 + w for a folder's fp32 w (as Gemma's own
        # RMSNorm computes it), and a GGUF file's stored 1 + w to the bit for the w the loader
        # gives back from it (pagoda.engine.loading.gguf).
        norm = weight.to(torch.float64) + self.arch.norm_offset  # on the loader's CPU
        return norm.to(device=placement.device, dtype=torch.float32).to(placement.dtype)

    def _multi_token_predictor(self, w: MutableMapping[str, Weight],
                               placement: Placement) -> MultiTokenPredictor | None:
        like = self.arch.mtp_like
        if like is None or mtp.FC not in w:
            return None
        norms = (self._norm(w[name], placement)
                 for name in (mtp.EMBEDDING_NORM, mtp.HIDDEN_NORM, mtp.NORM))
        return MultiTokenPredictor(make_linear(w[mtp.FC], None, placement), *norms,
                                   self._load_layer(mtp.as_main_layer(w, like), like, placement))

    def _per_layer_embeddings(self, w: MutableMapping[str, Weight],
                              placement: Placement) -> PerLayerEmbeddings | None:
        width = self.arch.per_layer_input
        if not width:
            return None
        return PerLayerEmbeddings(
            table=make_embedding(w["model.embed_tokens_per_layer.weight"], placement),
            table_scale=torch.tensor(width ** 0.5, dtype=placement.dtype).item(),
            projection=make_linear(w["model.per_layer_model_projection.weight"], None, placement),
            projection_scale=self.shape.hidden_size ** -0.5,
            norm=self._norm(w["model.per_layer_projection_norm.weight"], placement),
            num_layers=self.shape.num_layers, width=width)

    def _load_layer(self, w: MutableMapping[str, Weight], index: int,
                    placement: Placement) -> DecoderLayer:
        arch, s, names = self.arch, self.shape, self.arch.names
        prefix = f"model.layers.{index}."

        kind = arch.layers[index]

        def linear(modules: tuple[str, ...]) -> Linear:
            weights = [w[f"{prefix}{m}.weight"] for m in modules]
            bias = _fused(w, [f"{prefix}{m}.bias" for m in modules])
            return make_fused_linear(weights, bias, placement)

        def norm(module: str | None) -> torch.Tensor | None:
            return None if module is None else self._norm(w[f"{prefix}{module}.weight"],
                                                          placement)

        kv_from = None if s.kv_owner(index) == index else s.kv_owner(index)
        if isinstance(kind, ShortConvKind):
            mixer, attention = self._short_conv(w, prefix, kind, linear, placement), None
        elif isinstance(kind, Mamba2Kind):
            mixer, attention = self._mamba2(w, prefix, kind, placement), None
        elif isinstance(kind, GatedDeltaNetKind):
            mixer, attention = self._gated_delta_net(w, prefix, kind, placement), None
        else:
            mixer, attention = None, self._attention(w, index, kind, linear, norm, placement)
        scalar = (None if names.layer_scalar is None else
                  w[prefix + names.layer_scalar].to(device=placement.device, dtype=placement.dtype))
        mlp = (self._sparse_mlp(w, prefix, linear, placement) if arch.is_sparse(index)
               else GatedMLP(linear(names.gate_up), linear((names.down,)), arch.activation))
        return DecoderLayer(
            input_norm=norm(names.input_norm), attention=attention,
            mlp_norm=norm(names.mlp_norm), mlp=mlp,
            attention_out_norm=norm(names.attention_out_norm),
            mlp_out_norm=norm(names.mlp_out_norm), scalar=scalar,
            per_layer=(PerLayerInput(linear((names.per_layer_gate,)),
                                     linear((names.per_layer_projection,)),
                                     norm(names.per_layer_norm), arch.activation)
                       if arch.per_layer_input else None),
            kv_from=kv_from, mixer=mixer,
            mixer_projections=() if mixer is None else (mixer.in_proj, mixer.out_proj))

    def _attention(self, w: MutableMapping[str, Weight], index: int, kind: AttentionKind,
                   linear: Callable[[tuple[str, ...]], Linear],
                   norm: Callable[[str | None], torch.Tensor | None],
                   placement: Placement) -> Attention:
        arch, s, names = self.arch, self.shape, self.arch.names
        num_kv_heads, head_dim = s.kv_heads(index)
        # q alone where the layer reads another's KV cache; no v_proj where its values are its
        # keys' projection.
        qkv = names.qkv[:qkv_modules(arch, index)]
        reads_another = s.kv_owner(index) != index
        return Attention(
            qkv_proj=(self._gated_qkv(w, index, qkv, placement) if kind.output_gate
                      else linear(qkv)),
            o_proj=linear((names.o,)),
            heads=HeadShape(s.num_heads, num_kv_heads, head_dim), window=kind.window,
            rope=kind.rope, scale=arch.scale, eps=s.rms_norm_eps,
            q_norm=norm(names.q_norm), k_norm=None if reads_another else norm(names.k_norm),
            v_norm=(torch.ones(head_dim, dtype=placement.dtype, device=placement.device)
                    if arch.value_norm else None),
            values_from_keys=kind.values_from_keys, softcap=arch.attention_softcap,
            sinks=(None if names.sinks is None else  # fp32 as the softmax that reads them
                   w[f"model.layers.{index}.{names.sinks}"].to(device=placement.device,
                                                                dtype=torch.float32)),
            output_gate=kind.output_gate)

    def _gated_qkv(self, w: MutableMapping[str, Weight], index: int, qkv: tuple[str, ...],
                   placement: Placement) -> Linear:
        """q, k, v and the output gate in one matmul, the gate's rows last (what Attention
        splits off), from a q_proj whose heads each hold their query rows then their gate's."""
        num_kv_heads, head_dim = self.shape.kv_heads(index)
        prefix = f"model.layers.{index}."
        q_proj, *kv = (w[f"{prefix}{m}.weight"] for m in qkv)
        queries, gates = split_gated_queries(q_proj, self.shape.num_heads, head_dim)
        return make_fused_linear([queries, *kv, gates], None, placement)

    def _short_conv(self, w: MutableMapping[str, Weight], prefix: str, kind: ShortConvKind,
                    linear: Callable[[tuple[str, ...]], Linear],
                    placement: Placement) -> ShortConv:
        conv = f"{prefix}{kind.module}.conv"
        # Kept fp32, as the states are: the convolution casts them to the step's dtype.
        weight = w[f"{conv}.weight"].to(device=placement.device, dtype=torch.float32)
        bias = w.get(f"{conv}.bias") if kind.bias else None
        return ShortConv(
            in_proj=linear((f"{kind.module}.in_proj",)),
            out_proj=linear((f"{kind.module}.out_proj",)),
            weight=weight.reshape(weight.shape[0], -1),
            bias=None if bias is None else bias.to(device=placement.device, dtype=torch.float32))

    def _mamba2(self, w: MutableMapping[str, Weight], prefix: str, kind: Mamba2Kind,
                placement: Placement) -> Mamba2Mixer:
        module = f"{prefix}{kind.module}."
        names = ["in_proj.weight", "conv1d.weight", "A_log", "D", "dt_bias", "norm.weight",
                 "out_proj.weight"]
        names += ["conv1d.bias"] if kind.conv_bias else []
        names += ["in_proj.bias", "out_proj.bias"] if kind.proj_bias else []
        tensors = {name: w[module + name] for name in names}
        chunk = CPU_SCAN_CHUNK if placement.device.type == "cpu" else kind.chunk_size
        config = Mamba2Config(
            num_heads=kind.num_heads, head_dim=kind.head_dim, state_size=kind.state_size,
            n_groups=kind.n_groups, conv_kernel=kind.conv_kernel, chunk_size=chunk,
            eps=self.shape.rms_norm_eps, time_step_limit=kind.time_step_limit)
        return Mamba2Mixer.from_hf(tensors, config, placement)

    def _gated_delta_net(self, w: MutableMapping[str, Weight], prefix: str,
                         kind: GatedDeltaNetKind, placement: Placement) -> GatedDeltaNet:
        module = f"{prefix}{kind.module}."
        tensors = {name[len(module):]: tensor for name, tensor in w.items()
                   if name.startswith(module)}
        shape = DeltaNetShape(kind.num_k_heads, kind.num_v_heads, kind.k_dim, kind.v_dim,
                              kind.conv_kernel, tiled=kind.tiled)
        return _DELTA_NET_LAYOUTS[kind.layout](tensors, shape, self.shape.rms_norm_eps,
                                               placement)

    def _sparse_mlp(self, w: MutableMapping[str, Weight], prefix: str,
                    linear: Callable[[tuple[str, ...]], Linear],
                    placement: Placement) -> SparseMoE:
        moe = self.arch.moe
        router = Router(linear((ROUTER,)), moe.top_k, moe.scoring, moe.renormalize,
                        moe.softmax_after_top_k)

        def expert(e: int) -> ExpertWeights:
            names = [f"{prefix}{EXPERTS}.{e}.{module}" for module in EXPERT_MODULES]
            biases = [w[f"{name}.bias"] for name in names] if moe.expert_bias else [None] * 3
            return ExpertWeights(*(w[f"{name}.weight"] for name in names), *biases)

        activation = ExpertActivation(moe.activation, moe.swiglu_limit, moe.swiglu_alpha)
        experts = experts_method_for([expert(e) for e in range(moe.num_experts)], activation,
                                     placement)
        shared = (GatedMLP(linear((f"{SHARED_EXPERT}.gate_proj", f"{SHARED_EXPERT}.up_proj")),
                           linear((f"{SHARED_EXPERT}.down_proj",)), self.arch.activation)
                  if moe.shared_expert_size else None)
        shared_gate = linear((SHARED_EXPERT_GATE,)) if moe.shared_expert_gate else None
        return SparseMoE(router, experts, shared, shared_gate)


# GatedDeltaNetKind.layout -> its constructor from the layer's tensors.
_DELTA_NET_LAYOUTS = {"qwen3_5": qwen3_5_gated_delta_net, "qwen3_next": qwen3_next_gated_delta_net,
                      "qwen3_next_split": qwen3_next_split_gated_delta_net}


def _fused(w: MutableMapping[str, Weight], names: list[str]) -> Weight | None:
    """Concatenate projections that share an input into one matmul (None if absent)."""
    if names[0] not in w:
        return None
    return concat([w[n] for n in names]) if len(names) > 1 else w[names[0]]
