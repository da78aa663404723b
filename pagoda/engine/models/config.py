"""What a model's Hugging Face config implies, read the same way by every family: head size,
each layer's attention window, the model's shape, and every weight's shape.

The model code and the loader both read these facts; they live beside the model, which is what
they describe, so the loader depends on the model's definition and not the other way round.
"""

from __future__ import annotations

import transformers

from pagoda.engine.errors import ModelLoadError
from pagoda.engine.models.architecture import (
    EXPERT_MODULES,
    EXPERTS,
    FULL_ATTENTION,
    ROUTER,
    SHARED_EXPERT,
    SHARED_EXPERT_GATE,
    AttentionKind,
    DecoderArchitecture,
    GatedDeltaNetKind,
    Mamba2Kind,
    ModelShape,
    MoESpec,
    ShortConvKind,
)
from pagoda.engine.models.mtp import mtp_weight_shapes

# What a config may state per layer (transformers' per_layer_config: Gemma 4's global layers).
_PER_LAYER_ATTRIBUTES = frozenset({"head_dim", "num_key_value_heads"})
# A mixture of experts' bounds (llama.cpp's LLAMA_MAX_EXPERTS a layer): each expert of each layer
# is three weights by name, named before any is read.
MAX_EXPERTS = 1024
MAX_EXPERT_MATRICES = 1 << 16  # layers x experts
# The kinds of layer_types whose layers mix tokens with a recurrent state, not attention.
# LFM2's short convolutions; transformers 5's name for state-space and linear-attention layers
# (Granite 4's "mamba", which it renames so on load).
RECURRENT_LAYER_TYPES = frozenset({"conv", "linear_attention"})
_ATTENTION_LAYER_TYPES = frozenset({"full_attention", "sliding_attention"})


def head_dim(config: transformers.PretrainedConfig) -> int:
    """The head size (of the first layer where layers differ: see `layer_heads`)."""
    config = _first_layer(config)
    dim = getattr(config, "head_dim", None)
    return dim if dim is not None else config.hidden_size // config.num_attention_heads


def kv_heads(config: transformers.PretrainedConfig) -> int:
    """The KV heads (of the first layer where layers differ: see `layer_heads`)."""
    config = _first_layer(config)
    return getattr(config, "num_key_value_heads", None) or config.num_attention_heads


def layer_heads(config: transformers.PretrainedConfig) -> tuple[tuple[int, int], ...]:
    """Each layer's (KV heads, head size) where the config states them per layer, else ()."""
    if not getattr(config, "is_heterogeneous", False):
        return ()
    varying = set(config.per_layer_attributes) - _PER_LAYER_ATTRIBUTES
    if varying:
        raise ModelLoadError(
            f"config.json sets {', '.join(sorted(varying))} per layer (per_layer_config), which "
            "Pagoda does not run: it runs layers that differ in head size and KV heads only.")
    layers = config.per_layer_config
    heads = tuple((kv_heads(layers[i]), head_dim(layers[i]))
                  for i in range(config.num_hidden_layers))
    return () if len(set(heads)) == 1 else heads


def layer_kv_from(config: transformers.PretrainedConfig) -> tuple[int, ...]:
    """Each layer's KV cache owner where the last `num_kv_shared_layers` layers (Gemma 4's
    E2B/E4B) read the keys and values of the last earlier layer of their own kind, else ()."""
    shared = getattr(config, "num_kv_shared_layers", 0) or 0
    if not shared:
        return ()
    layers = config.num_hidden_layers
    first = layers - shared
    kinds = layer_types(config)
    owners = {kind: i for i, kind in enumerate(kinds[:first])}  # the last of each kind
    missing = sorted(set(kinds[first:]) - owners.keys())
    if first < 1 or missing:
        raise ModelLoadError(
            f"config.json shares the KV caches of its last {shared} of {layers} layers "
            f"(num_kv_shared_layers), but no earlier layer of kind {', '.join(missing) or 'any'} "
            "holds one to share. The model's settings are damaged.")
    return tuple(i if i < first else owners[kinds[i]] for i in range(layers))


def layer_intermediate(config: transformers.PretrainedConfig) -> tuple[int, ...]:
    """Each layer's MLP width where Gemma 4's layers that share KV caches have MLPs twice as
    wide (`use_double_wide_mlp`), else ()."""
    owners = layer_kv_from(config)
    if not (owners and getattr(config, "use_double_wide_mlp", False)):
        return ()
    width = config.intermediate_size
    return tuple(width if owner == i else 2 * width for i, owner in enumerate(owners))


def _first_layer(config: transformers.PretrainedConfig) -> transformers.PretrainedConfig:
    """A config to read per-layer attributes from: the first layer's where layers differ (the
    whole config then refuses to say them)."""
    if getattr(config, "is_heterogeneous", False):
        return config.per_layer_config[0]
    return config


def layer_types(config: transformers.PretrainedConfig) -> list[str]:
    """Each layer's kind as config.json names it: "full_attention", "sliding_attention", or
    a recurrent kind (RECURRENT_LAYER_TYPES)."""
    kinds = list(getattr(config, "layer_types", None) or [])
    if not kinds:
        return ["full_attention"] * config.num_hidden_layers
    if len(kinds) != config.num_hidden_layers:
        raise ModelLoadError(
            f"config.json names {len(kinds)} layer types (layer_types) for "
            f"{config.num_hidden_layers} layers. The model's settings are damaged.")
    unknown = sorted(set(kinds) - _ATTENTION_LAYER_TYPES - RECURRENT_LAYER_TYPES)
    if unknown:
        known = ", ".join(sorted(_ATTENTION_LAYER_TYPES | RECURRENT_LAYER_TYPES))
        raise ModelLoadError(f"config.json's layer_types include {', '.join(unknown)}, which "
                             f"Pagoda does not run (it runs {known}).")
    return kinds


def recurrent_layers(config: transformers.PretrainedConfig) -> frozenset[int]:
    """The layers whose layer_types entry is a recurrent kind (LFM2's "conv")."""
    return frozenset(i for i, kind in enumerate(layer_types(config))
                     if kind in RECURRENT_LAYER_TYPES)


def layer_windows(config: transformers.PretrainedConfig) -> tuple[int, ...]:
    """Each layer's attention window (FULL_ATTENTION for all keys).

    Hugging Face windows the "sliding_attention" layers of `layer_types` (Qwen2/3 derive them
    from max_window_layers, Gemma 3 from its pattern), every layer when a window is set and
    no types are named (Mistral), none when use_sliding_window is false.
    """
    window = getattr(config, "sliding_window", None)
    if not getattr(config, "use_sliding_window", True) or not window:
        return (FULL_ATTENTION,) * config.num_hidden_layers
    if window < 1:
        raise ModelLoadError(f"config.json's sliding_window is {window}: a window needs at "
                             "least one key.")
    if not getattr(config, "layer_types", None):
        return (int(window),) * config.num_hidden_layers
    return tuple(int(window) if kind == "sliding_attention" else FULL_ATTENTION
                 for kind in layer_types(config))


def model_shape(config: transformers.PretrainedConfig,
                windows: tuple[int, ...] | None = None) -> ModelShape:
    return ModelShape(
        num_layers=config.num_hidden_layers, hidden_size=config.hidden_size,
        num_heads=config.num_attention_heads, num_kv_heads=kv_heads(config),
        head_dim=head_dim(config), vocab_size=config.vocab_size,
        rms_norm_eps=_norm_eps(config),
        max_position_embeddings=config.max_position_embeddings,
        intermediate_size=config.intermediate_size,
        layer_windows=windows if windows is not None else layer_windows(config),
        layer_heads=layer_heads(config), layer_kv_from=layer_kv_from(config),
        layer_intermediate=layer_intermediate(config), recurrent_layers=recurrent_layers(config))


def _norm_eps(config: transformers.PretrainedConfig) -> float:
    """The RMSNorms' epsilon: rms_norm_eps, or norm_eps as LFM2 names it."""
    eps = getattr(config, "rms_norm_eps", None)
    return eps if eps is not None else config.norm_eps


def routed_experts(config: transformers.PretrainedConfig, count_key: str) -> tuple[int, int]:
    """A mixture of experts' (experts, experts a token goes to): `count_key` and
    num_experts_per_tok, checked, and the experts bounded before a weight is named for each."""
    experts, top_k = getattr(config, count_key), config.num_experts_per_tok
    if not 0 < top_k <= experts:
        raise ModelLoadError(
            f"config.json routes each token to {top_k} (num_experts_per_tok) of {experts} "
            f"experts ({count_key}). The model's settings are damaged.")
    if experts > MAX_EXPERTS or experts * config.num_hidden_layers > MAX_EXPERT_MATRICES:
        raise ModelLoadError(
            f"config.json has {experts} experts ({count_key}) in each of "
            f"{config.num_hidden_layers} layers, more than Pagoda reads ({MAX_EXPERTS} a layer, "
            f"{MAX_EXPERT_MATRICES} in all, as llama.cpp bounds them).")
    return experts, top_k


def qkv_modules(arch: DecoderArchitecture, index: int) -> int:
    """How many of `names.qkv` layer `index` has: q alone where it reads another layer's KV
    cache, q and k where its values are its keys' projection, else all."""
    if arch.shape.kv_owner(index) != index:
        return 1
    return 2 if arch.layers[index].values_from_keys else len(arch.names.qkv)


def weight_shapes(arch: DecoderArchitecture) -> dict[str, tuple[int, ...]]:
    """Every parameter the model needs, by Hugging Face name, with its shape."""
    s = arch.shape
    shapes: dict[str, tuple[int, ...]] = {"model.embed_tokens.weight": (s.vocab_size,
                                                                        s.hidden_size)}
    for i in range(s.num_layers):
        shapes |= _layer_weight_shapes(arch, i)
    shapes[f"{arch.final_norm}.weight"] = (s.hidden_size,)
    if not arch.tied_embeddings:
        shapes["lm_head.weight"] = (s.vocab_size, s.hidden_size)
    if arch.per_layer_input:
        width = s.num_layers * arch.per_layer_input
        shapes |= {"model.embed_tokens_per_layer.weight": (s.vocab_size, width),
                   "model.per_layer_model_projection.weight": (width, s.hidden_size),
                   "model.per_layer_projection_norm.weight": (arch.per_layer_input,)}
    return shapes


def mtp_block_shapes(arch: DecoderArchitecture) -> dict[str, tuple[int, ...]]:
    """A multi-token-prediction block's parameters (pagoda.engine.models.mtp), by Hugging Face
    name, where the family's files may carry one; else none. A file need not."""
    if arch.mtp_like is None:
        return {}
    return mtp_weight_shapes(arch, _layer_weight_shapes(arch, arch.mtp_like))


def _layer_weight_shapes(arch: DecoderArchitecture, index: int) -> dict[str, tuple[int, ...]]:
    """Layer `index`'s parameters: its own head size, KV heads and MLP width; no v_proj where
    its values are its keys' projection, only q_proj and q_norm where it reads another layer's
    KV cache."""
    s, names = arch.shape, arch.names
    num_kv_heads, size = s.kv_heads(index)
    q, kv = s.num_heads * size, num_kv_heads * size
    intermediate = s.intermediate(index)
    kind = arch.layers[index]
    recurrent = not isinstance(kind, AttentionKind)
    by_module: dict[str, tuple[tuple[int, ...], bool]] = {}
    if isinstance(kind, ShortConvKind):
        by_module |= _short_conv_modules(kind, s.hidden_size)
    elif isinstance(kind, Mamba2Kind):
        by_module |= _mamba2_modules(kind, s.hidden_size)
    elif isinstance(kind, GatedDeltaNetKind):
        by_module |= _gated_delta_net_modules(kind, s.hidden_size)
    else:
        by_module[names.o] = ((s.hidden_size, q), arch.o_bias)
        q_rows = 2 * q if kind.output_gate else q  # each head's query rows, then its gate's
        qkv_rows = (q_rows, kv, kv) if len(names.qkv) == 3 else (q_rows + 2 * kv,)
        for module, rows in list(zip(names.qkv, qkv_rows, strict=True))[:qkv_modules(arch,
                                                                                   index)]:
            by_module[module] = ((rows, s.hidden_size), arch.qkv_bias)
    if arch.is_sparse(index):
        by_module |= _sparse_mlp_modules(arch.moe, s.hidden_size)
    else:
        by_module[names.down] = ((s.hidden_size, intermediate), arch.mlp_bias)
        gate_up_rows = (intermediate,) * 2 if len(names.gate_up) == 2 else (2 * intermediate,)
        for module, rows in zip(names.gate_up, gate_up_rows, strict=True):
            by_module[module] = ((rows, s.hidden_size), arch.mlp_bias)
    shares_kv = s.kv_owner(index) != index
    norms = {names.input_norm: s.hidden_size, names.mlp_norm: s.hidden_size,
             names.attention_out_norm: s.hidden_size, names.mlp_out_norm: s.hidden_size}
    if not recurrent:
        norms |= {names.q_norm: size, None if shares_kv else names.k_norm: size}
    if arch.per_layer_input:
        norms[names.per_layer_norm] = s.hidden_size
        by_module |= {names.per_layer_gate: ((arch.per_layer_input, s.hidden_size), False),
                      names.per_layer_projection: ((s.hidden_size, arch.per_layer_input), False)}
    layer = f"model.layers.{index}"
    shapes: dict[str, tuple[int, ...]] = {}
    for module, (shape, has_bias) in by_module.items():
        shapes[f"{layer}.{module}.weight"] = shape
        if has_bias:
            shapes[f"{layer}.{module}.bias"] = (shape[0],)
    for module, width in norms.items():
        if module is not None:
            shapes[f"{layer}.{module}.weight"] = (width,)
    if isinstance(kind, Mamba2Kind):
        shapes |= {f"{layer}.{kind.module}.{p}": (kind.num_heads,) for p in MAMBA2_PER_HEAD}
    if isinstance(kind, GatedDeltaNetKind):
        shapes |= {f"{layer}.{kind.module}.{p}": (kind.num_v_heads,) for p in ("A_log", "dt_bias")}
    if names.layer_scalar is not None:
        shapes[f"{layer}.{names.layer_scalar}"] = (1,)
    if names.sinks is not None:
        shapes[f"{layer}.{names.sinks}"] = (s.num_heads,)
    return shapes


def _short_conv_modules(kind: ShortConvKind,
                        hidden: int) -> dict[str, tuple[tuple[int, ...], bool]]:
    """A short convolution's modules (shape, has a bias): in_proj to B, C and x, the depthwise
    convolution's taps (Hugging Face's Conv1d weight, [channels, 1, kernel]), out_proj."""
    return {f"{kind.module}.in_proj": ((3 * hidden, hidden), kind.bias),
            f"{kind.module}.conv": ((hidden, 1, kind.kernel), kind.bias),
            f"{kind.module}.out_proj": ((hidden, hidden), kind.bias)}


# A Mamba-2 layer's parameters of one value per head (no ".weight" suffix).
MAMBA2_PER_HEAD = ("A_log", "D", "dt_bias")


def _mamba2_modules(kind: Mamba2Kind, hidden: int) -> dict[str, tuple[tuple[int, ...], bool]]:
    """A Mamba-2 mixer's modules (shape, has a bias): in_proj to z, x|B|C and a time step per
    head, the depthwise convolution's taps ([channels, 1, kernel]), the gated norm, out_proj."""
    in_width = kind.inner_size + kind.conv_channels + kind.num_heads
    return {f"{kind.module}.in_proj": ((in_width, hidden), kind.proj_bias),
            f"{kind.module}.conv1d": ((kind.conv_channels, 1, kind.conv_kernel), kind.conv_bias),
            f"{kind.module}.norm": ((kind.inner_size,), False),
            f"{kind.module}.out_proj": ((hidden, kind.inner_size), kind.proj_bias)}


def _gated_delta_net_modules(kind: GatedDeltaNetKind,
                             hidden: int) -> dict[str, tuple[tuple[int, ...], bool]]:
    """A Gated DeltaNet's modules (shape, has a bias): its input projections in the family's
    layout, the depthwise convolution's taps ([channels, 1, kernel]), the gated norm (one
    weight of v_dim for every value head), out_proj."""
    value_width = kind.num_v_heads * kind.v_dim
    if kind.layout == "qwen3_next":
        projections = {"in_proj_qkvz": kind.conv_channels + value_width,
                       "in_proj_ba": 2 * kind.num_v_heads}
    elif kind.layout == "qwen3_next_split":
        projections = {"in_proj_qkv": kind.conv_channels, "in_proj_z": value_width,
                       "in_proj_ba": 2 * kind.num_v_heads}
    else:
        projections = {"in_proj_qkv": kind.conv_channels, "in_proj_z": value_width,
                       "in_proj_b": kind.num_v_heads, "in_proj_a": kind.num_v_heads}
    modules = {f"{kind.module}.{name}": ((rows, hidden), False)
               for name, rows in projections.items()}
    return modules | {
        f"{kind.module}.conv1d": ((kind.conv_channels, 1, kind.conv_kernel), False),
        f"{kind.module}.norm": ((kind.v_dim,), False),
        f"{kind.module}.out_proj": ((hidden, value_width), False)}


def _sparse_mlp_modules(moe: MoESpec, hidden: int) -> dict[str, tuple[tuple[int, ...], bool]]:
    """A sparse layer's modules (shape, has a bias): the router, every expert's gate, up and
    down, the shared expert and its gate."""
    modules = {ROUTER: ((moe.num_experts, hidden), moe.router_bias)}
    for e in range(moe.num_experts):
        modules |= {f"{EXPERTS}.{e}.{m}": (shape, moe.expert_bias)
                    for m, shape in _gated_mlp_shapes(moe.intermediate_size, hidden).items()}
    if moe.shared_expert_size:
        modules |= {f"{SHARED_EXPERT}.{m}": (shape, False)
                    for m, shape in _gated_mlp_shapes(moe.shared_expert_size, hidden).items()}
    if moe.shared_expert_gate:
        modules[SHARED_EXPERT_GATE] = ((1, hidden), False)
    return modules


def _gated_mlp_shapes(width: int, hidden: int) -> dict[str, tuple[int, int]]:
    """gate_proj, up_proj and down_proj of a gated MLP `width` wide."""
    return dict(zip(EXPERT_MODULES, ((width, hidden), (width, hidden), (hidden, width)),
                    strict=True))
