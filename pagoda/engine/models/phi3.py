"""The Phi-3 family: Phi-3/3.5-mini and Phi-4-mini. A Llama layer whose q, k and v are one
matrix (qkv_proj) and gate and up another (gate_up_proj), with partial rotary (Phi-4-mini rotates
3/4 of each head) and LongRoPE (short factors within the trained context, long ones beyond it).

Hugging Face windows every layer when config.json sets sliding_window (Phi-3-mini: 2047 keys);
so does Pagoda, where llama.cpp ignores the window (it disables Phi's sliding window).
"""

from __future__ import annotations

from transformers import Phi3Config, PretrainedConfig

from pagoda.engine.errors import ModelLoadError
from pagoda.engine.layers.mlp import activation_of
from pagoda.engine.layers.rotary import rope_spec
from pagoda.engine.models.architecture import AttentionKind, DecoderArchitecture, LayerNames
from pagoda.engine.models.config import head_dim, model_shape
from pagoda.engine.models.gguf_config import (
    GGUFSettings,
    count,
    llama_shape,
    number,
    rope_theta,
    rotary_dims,
)

NAME = "Phi-3"  # its entry in pagoda/engine/models/registry.py names the model types it covers


def architecture(config: PretrainedConfig) -> DecoderArchitecture:
    shape = model_shape(config)
    return DecoderArchitecture(
        family=NAME, shape=shape,
        layers=tuple(AttentionKind(window) for window in shape.layer_windows),
        ropes={"default": rope_spec(config, head_dim(config))},
        names=LayerNames(qkv=("self_attn.qkv_proj",), gate_up=("mlp.gate_up_proj",)),
        activation=activation_of(getattr(config, "hidden_act", None), NAME),
        tied_embeddings=bool(config.tie_word_embeddings))


def config_from_gguf(settings: GGUFSettings) -> PretrainedConfig:
    """A phi3 file's config from its own keys, where transformers' reader would leave partial
    rotary, the trained context, longrope and the window at Phi3Config's defaults.

    llama.cpp's converter writes longrope's per-frequency factors as two tensors
    (rope_factors_short, rope_factors_long) and the trained context as
    rope.scaling.original_context_length."""
    shape = llama_shape(settings)
    size = shape["head_dim"]
    rotated = rotary_dims(settings, size)
    original = count(settings, "rope.scaling.original_context_length",
                     default=shape["max_position_embeddings"])
    rope = {"rope_type": "default", "rope_theta": rope_theta(settings),
            "partial_rotary_factor": _partial_rotary_factor(rotated, size),
            **_longrope(settings, rotated // 2, original)}
    window = settings.metadata("phi3.attention.sliding_window")  # 0: none (Phi-4)
    return Phi3Config(**shape, rope_parameters=rope, original_max_position_embeddings=original,
                      sliding_window=count(settings, "attention.sliding_window") if window else None)


def _partial_rotary_factor(rotated: int, size: int) -> float:
    factor = rotated / size
    if int(size * factor) != rotated:  # how transformers turns it back into dimensions
        raise ModelLoadError(f"The file rotates {rotated} of each head's {size} dimensions, a "
                             "share Pagoda cannot state exactly as a partial_rotary_factor.")
    return factor


def _longrope(settings: GGUFSettings, pairs: int, original: int) -> dict:
    """longrope's rope settings where the file holds its factors (one per rotated pair)."""
    short = settings.small_vector("rope_factors_short.weight", pairs)
    long = settings.small_vector("rope_factors_long.weight", pairs)
    if short is None and long is None:
        return {}
    if short is None or long is None:
        raise ModelLoadError("The file holds only one of rope_factors_short and "
                             "rope_factors_long; longrope needs both. The file is damaged: "
                             "re-download it.")
    scaling = {"rope_type": "longrope", "short_factor": short, "long_factor": long,
               "original_max_position_embeddings": original}
    if settings.metadata("phi3.rope.scaling.attn_factor") is not None:
        scaling["attention_factor"] = number(settings, "rope.scaling.attn_factor", 1.0)
    return scaling
