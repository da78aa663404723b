"""The Gemma 4 family (text, dense): Gemma 3's layers (windowed and global, q/k norms, sandwich
norms, GeGLU, embeddings times sqrt(hidden), final softcap) with what Gemma 4 changed: norms scale
by w (not 1 + w), attention is not scaled (its q/k norms set the scale), values are RMS-normed
per head without a weight, each layer's output is multiplied by its own scalar, and the global
layers have their own head size and KV heads, rotate by "proportional" RoPE (a share of the
head's pairs, the rest at frequency 0) and, where `attention_k_eq_v`, take their values from
the keys' projection (no v_proj). The small models (E2B, E4B) add per-layer embeddings (each
token's input to every layer, `hidden_size_per_layer_input`) and have their last layers read
the KV caches of earlier ones (`num_kv_shared_layers`), with MLPs twice as wide there
(`use_double_wide_mlp`).

Not run, refused with the reason: mixture-of-experts layers (`enable_moe_block`) and attention in
both directions over all tokens.
"""

from __future__ import annotations

from transformers import Gemma4TextConfig, PretrainedConfig

from pagoda.engine.errors import ModelLoadError
from pagoda.engine.layers.mlp import activation_of
from pagoda.engine.layers.rotary import rope_spec
from pagoda.engine.models.architecture import AttentionKind, DecoderArchitecture, LayerNames
from pagoda.engine.models.config import layer_types, model_shape
from pagoda.engine.models.gguf_config import GGUFSettings, count, layer_counts, llama_shape, number
from pagoda.engine.models.registry import MIXTURE_OF_EXPERTS

NAME = "Gemma 4"  # its entry in pagoda/engine/models/registry.py names the model types it covers

GEMMA4_NAMES = LayerNames(
    attention_out_norm="post_attention_layernorm", mlp_norm="pre_feedforward_layernorm",
    mlp_out_norm="post_feedforward_layernorm", q_norm="self_attn.q_norm",
    k_norm="self_attn.k_norm", layer_scalar="layer_scalar",
    per_layer_gate="per_layer_input_gate", per_layer_projection="per_layer_projection",
    per_layer_norm="post_per_layer_input_norm")

_SLIDING, _FULL = "sliding_attention", "full_attention"


def architecture(config: PretrainedConfig) -> DecoderArchitecture:
    _refuse_what_is_not_run(config)
    shape = model_shape(config)
    kinds = layer_types(config)
    # The global layers' values are their keys' projection (transformers' "alternative
    # attention"); the windowed layers keep their v_proj.
    keys_as_values = bool(getattr(config, "attention_k_eq_v", False))
    head_size = {kind: shape.kv_heads(kinds.index(kind))[1] for kind in set(kinds)}
    bias = bool(getattr(config, "attention_bias", False))
    return DecoderArchitecture(
        family=NAME, shape=shape,
        layers=tuple(AttentionKind(window, kind, values_from_keys=keys_as_values and kind == _FULL)
                     for window, kind in zip(shape.layer_windows, kinds, strict=True)),
        ropes={kind: rope_spec(config, head_size[kind], kind) for kind in sorted(head_size)},
        names=GEMMA4_NAMES,
        attention_scale=1.0,
        activation=activation_of(config.hidden_activation, NAME),
        embedding_scale=config.hidden_size ** 0.5,
        final_softcap=config.final_logit_softcapping,
        value_norm=True,
        per_layer_input=getattr(config, "hidden_size_per_layer_input", 0) or 0,
        tied_embeddings=bool(config.tie_word_embeddings), qkv_bias=bias, o_bias=bias)


def _refuse_what_is_not_run(config: PretrainedConfig) -> None:
    if getattr(config, "enable_moe_block", False):
        raise ModelLoadError(
            f"This Gemma 4 model has mixture-of-experts layers (enable_moe_block): "
            f"{MIXTURE_OF_EXPERTS}. Pagoda runs the dense Gemma 4 models.")
    per_layer_vocabulary = getattr(config, "vocab_size_per_layer_input", config.vocab_size)
    if getattr(config, "hidden_size_per_layer_input", 0) and (
            per_layer_vocabulary != config.vocab_size):
        raise ModelLoadError(
            f"This Gemma 4 model's per-layer embeddings cover {per_layer_vocabulary} tokens "
            f"(vocab_size_per_layer_input) of its {config.vocab_size}, which Pagoda does not "
            "run: it runs per-layer embeddings of the whole vocabulary, as released.")
    if getattr(config, "use_bidirectional_attention", None) == "all":
        raise ModelLoadError(
            "This Gemma 4 model attends in both directions (use_bidirectional_attention: "
            "\"all\", an embedding model), which Pagoda does not run: it runs causal text "
            "generation models.")


# A GGUF file's config


def config_from_gguf(settings: GGUFSettings) -> PretrainedConfig:
    """A gemma4 file's config from its own keys, as llama.cpp reads them: a flag per layer for
    the windowed ones, the global layers' head size (`attention.key_length`; the windowed
    layers' is `key_length_swa`) and KV heads (a count per layer), their rotated share (the
    rope_freqs tensor: 1 for a rotated pair, 1e30 for one left alone), values from the keys
    where the global layers have no attn_v."""
    layers = count(settings, "block_count")
    scaling = settings.metadata("gemma4.rope.scaling.type")
    if scaling not in (None, "none"):
        raise ModelLoadError(
            f"The file scales RoPE by {scaling!r} (gemma4.rope.scaling.type), which Pagoda does "
            "not read from a gemma4 file: released Gemma 4 models rotate by proportional RoPE "
            "unscaled.")
    windowed = _windowed_layers(settings, layers)
    kv_heads = layer_counts(settings, "attention.head_count_kv", layers)
    shared = _optional_count(settings, "attention.shared_kv_layers")
    widths = layer_counts(settings, "feed_forward_length", layers)
    double_wide = _double_wide_mlps(widths, layers - shared)
    first_windowed = windowed.index(True) if any(windowed) else 0
    shape = llama_shape(settings, kv_heads=kv_heads[first_windowed], intermediate=widths[0])
    global_size = shape["head_dim"]  # attention.key_length: the global layers'
    shape["head_dim"] = count(settings, "attention.key_length_swa", default=global_size)
    full = [i for i, swa in enumerate(windowed) if not swa]
    cap = settings.metadata("gemma4.final_logit_softcapping")
    return Gemma4TextConfig(
        **shape, hidden_activation="gelu_pytorch_tanh",
        sliding_window=count(settings, "attention.sliding_window"),
        layer_types=[_SLIDING if swa else _FULL for swa in windowed],
        rope_parameters={
            _SLIDING: {"rope_type": "default",
                       "rope_theta": number(settings, "rope.freq_base_swa", 10000.0)},
            _FULL: {"rope_type": "proportional",
                    "rope_theta": number(settings, "rope.freq_base", 1000000.0),
                    "partial_rotary_factor": _rotated_share(settings, global_size)}},
        final_logit_softcapping=number(settings, "final_logit_softcapping", 0.0) if cap else None,
        attention_k_eq_v=bool(full) and all(
            settings.tensor_dims(f"blk.{i}.attn_v.weight") is None for i in full),
        hidden_size_per_layer_input=_optional_count(settings, "embedding_length_per_layer_input"),
        vocab_size_per_layer_input=shape["vocab_size"],
        num_kv_shared_layers=shared, use_double_wide_mlp=double_wide,
        enable_moe_block=bool(_optional_count(settings, "expert_count")),
        per_layer_config={i: {"head_dim": global_size, "num_key_value_heads": kv_heads[i]}
                          for i in full})


def _double_wide_mlps(widths: list[int], first_shared: int) -> bool:
    """Whether the layers that share KV caches (from first_shared on) have MLPs twice as wide
    as the others, the only way a Gemma 4 file's widths differ."""
    if len(set(widths)) == 1:
        return False
    doubled = [widths[0]] * first_shared + [2 * widths[0]] * (len(widths) - first_shared)
    if widths != doubled:
        raise ModelLoadError(
            f"The file's gemma4.feed_forward_length states the MLP widths {widths}, where a "
            "Gemma 4 model has one width, doubled on the layers that share KV caches. The file "
            "is damaged: re-download it.")
    return True


def _windowed_layers(settings: GGUFSettings, layers: int) -> list[bool]:
    flags = settings.metadata("gemma4.attention.sliding_window_pattern")
    if not isinstance(flags, list) or len(flags) != layers:
        raise ModelLoadError(
            f"The file's gemma4.attention.sliding_window_pattern is {flags!r}, where one flag "
            f"per layer ({layers}) is needed. The file is damaged: re-download it.")
    return [bool(flag) for flag in flags]


def _rotated_share(settings: GGUFSettings, head_size: int) -> float:
    """The share of a global head's pairs that rotate: llama.cpp's rope_freqs divides the others'
    frequencies by 1e30."""
    factors = settings.small_vector("rope_freqs.weight", head_size // 2)
    if factors is None:
        return 1.0
    rotated = sum(1 for f in factors if f == 1.0)
    if any(f != 1.0 for f in factors[:rotated]) or any(f < 1e20 for f in factors[rotated:]):
        raise ModelLoadError(
            "The file's rope_freqs tensor is not a rotated share of the head followed by pairs "
            "left alone, which is all a Gemma 4 file holds there. The file is damaged: "
            "re-download it.")
    return 2 * rotated / head_size


def _optional_count(settings: GGUFSettings, key: str) -> int:
    return 0 if not settings.metadata(f"gemma4.{key}") else count(settings, key)
