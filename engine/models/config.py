"""What a model's Hugging Face config implies, read the same way by every family: head size,
each layer's attention window, the model's shape, and every weight's shape.

The model code and the loader both read these facts; they live beside the model, which is what
they describe, so the loader depends on the model's definition and not the other way round.
"""

from __future__ import annotations

import transformers

from engine.errors import ModelLoadError
from engine.models.architecture import FULL_ATTENTION, DecoderArchitecture, ModelShape

# What a config may state per layer (transformers' per_layer_config: Gemma 4's global layers).
_PER_LAYER_ATTRIBUTES = frozenset({"head_dim", "num_key_value_heads"})


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


def _first_layer(config: transformers.PretrainedConfig) -> transformers.PretrainedConfig:
    """A config to read per-layer attributes from: the first layer's where layers differ (the
    whole config then refuses to say them)."""
    if getattr(config, "is_heterogeneous", False):
        return config.per_layer_config[0]
    return config


def layer_types(config: transformers.PretrainedConfig) -> list[str]:
    """Each layer's kind as config.json names it: "full_attention" or "sliding_attention"."""
    kinds = list(getattr(config, "layer_types", None) or [])
    if not kinds:
        return ["full_attention"] * config.num_hidden_layers
    if len(kinds) != config.num_hidden_layers:
        raise ModelLoadError(
            f"config.json names {len(kinds)} layer types (layer_types) for "
            f"{config.num_hidden_layers} layers. The model's settings are damaged.")
    unknown = sorted(set(kinds) - {"full_attention", "sliding_attention"})
    if unknown:
        raise ModelLoadError(f"config.json's layer_types include {', '.join(unknown)}, which "
                             "Pagoda does not run (it runs full_attention and sliding_attention).")
    return kinds


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
        rms_norm_eps=config.rms_norm_eps,
        max_position_embeddings=config.max_position_embeddings,
        intermediate_size=config.intermediate_size,
        layer_windows=windows if windows is not None else layer_windows(config),
        layer_heads=layer_heads(config))


def weight_shapes(arch: DecoderArchitecture) -> dict[str, tuple[int, ...]]:
    """Every parameter the model needs, by Hugging Face name, with its shape."""
    s = arch.shape
    shapes: dict[str, tuple[int, ...]] = {"model.embed_tokens.weight": (s.vocab_size,
                                                                        s.hidden_size)}
    for i in range(s.num_layers):
        shapes |= _layer_weight_shapes(arch, i)
    shapes["model.norm.weight"] = (s.hidden_size,)
    if not arch.tied_embeddings:
        shapes["lm_head.weight"] = (s.vocab_size, s.hidden_size)
    return shapes


def _layer_weight_shapes(arch: DecoderArchitecture, index: int) -> dict[str, tuple[int, ...]]:
    """Layer `index`'s parameters: its own head size and KV heads, no v_proj where its values
    are its keys' projection."""
    s, names = arch.shape, arch.names
    num_kv_heads, size = s.kv_heads(index)
    q, kv = s.num_heads * size, num_kv_heads * size
    by_module: dict[str, tuple[tuple[int, ...], bool]] = {
        names.o: ((s.hidden_size, q), arch.o_bias),
        names.down: ((s.hidden_size, s.intermediate_size), arch.mlp_bias)}
    qkv_rows = (q, kv, kv) if len(names.qkv) == 3 else (q + 2 * kv,)
    qkv = zip(names.qkv, qkv_rows, strict=True)
    if arch.layers[index].values_from_keys:
        qkv = list(qkv)[:2]
    for module, rows in qkv:
        by_module[module] = ((rows, s.hidden_size), arch.qkv_bias)
    gate_up_rows = (s.intermediate_size,) * 2 if len(names.gate_up) == 2 else (
        2 * s.intermediate_size,)
    for module, rows in zip(names.gate_up, gate_up_rows, strict=True):
        by_module[module] = ((rows, s.hidden_size), arch.mlp_bias)
    norms = {names.input_norm: s.hidden_size, names.mlp_norm: s.hidden_size,
             names.attention_out_norm: s.hidden_size, names.mlp_out_norm: s.hidden_size,
             names.q_norm: size, names.k_norm: size}
    layer = f"model.layers.{index}"
    shapes: dict[str, tuple[int, ...]] = {}
    for module, (shape, has_bias) in by_module.items():
        shapes[f"{layer}.{module}.weight"] = shape
        if has_bias:
            shapes[f"{layer}.{module}.bias"] = (shape[0],)
    for module, width in norms.items():
        if module is not None:
            shapes[f"{layer}.{module}.weight"] = (width,)
    if names.layer_scalar is not None:
        shapes[f"{layer}.{names.layer_scalar}"] = (1,)
    return shapes
