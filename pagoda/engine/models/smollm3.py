"""The SmolLM3 family: Llama layers, of which those config.json marks 0 in no_rope_layers (every
fourth in the released models) use no position embedding at all (NoPE). Windows follow
layer_types, as Hugging Face defines them (none in the released models).
"""

from __future__ import annotations

from transformers import PretrainedConfig, SmolLM3Config

from pagoda.engine.errors import ModelLoadError
from pagoda.engine.layers.mlp import activation_of
from pagoda.engine.layers.rotary import rope_spec
from pagoda.engine.models.architecture import AttentionKind, DecoderArchitecture
from pagoda.engine.models.config import head_dim, model_shape
from pagoda.engine.models.gguf_config import GGUFSettings, llama_shape, rotary_dims, scaled_rope

NAME = "SmolLM3"  # its entry in pagoda/engine/models/registry.py names the model types it covers
# llama.cpp's rule for a smollm3 file, which does not list its NoPE layers: every fourth.
GGUF_NO_ROPE_INTERVAL = 4


def architecture(config: PretrainedConfig) -> DecoderArchitecture:
    shape = model_shape(config)
    bias = bool(getattr(config, "attention_bias", False))
    return DecoderArchitecture(
        family=NAME, shape=shape,
        layers=tuple(AttentionKind(window, "default" if rotated else None)
                     for window, rotated in zip(shape.layer_windows, rotated_layers(config),
                                                strict=True)),
        ropes={"default": rope_spec(config, head_dim(config))},
        activation=activation_of(getattr(config, "hidden_act", None), NAME),
        tied_embeddings=bool(config.tie_word_embeddings), qkv_bias=bias, o_bias=bias,
        mlp_bias=bool(getattr(config, "mlp_bias", False)))


def rotated_layers(config: PretrainedConfig) -> tuple[bool, ...]:
    """Whether each layer applies RoPE: config.json's no_rope_layers (1: RoPE, 0: NoPE), a list
    at least as long as the model's layers, or else every no_rope_layer_interval-th layer NoPE."""
    layers = config.num_hidden_layers
    flags = getattr(config, "no_rope_layers", None)
    if flags is None:
        interval = getattr(config, "no_rope_layer_interval", 4)
        if not isinstance(interval, int) or interval < 1:
            raise ModelLoadError(f"config.json's no_rope_layer_interval is {interval!r}: a "
                                 "whole number of layers, at least 1, is needed.")
        return tuple((i + 1) % interval != 0 for i in range(layers))
    if len(flags) < layers or any(flag not in (0, 1) for flag in flags[:layers]):
        raise ModelLoadError(
            f"config.json's no_rope_layers must hold a 1 (RoPE) or 0 (no RoPE) for each of the "
            f"{layers} layers; it holds {list(flags)[:layers + 1]}. The model's settings are "
            "damaged.")
    return tuple(bool(flag) for flag in flags[:layers])


def config_from_gguf(settings: GGUFSettings) -> PretrainedConfig:
    """A smollm3 file's config from its own keys (transformers' GGUF reader does not know the
    architecture). The file does not say which layers skip RoPE: llama.cpp takes every fourth,
    as the released models do and SmolLM3Config does by default, and so does Pagoda."""
    shape = llama_shape(settings)
    if rotary_dims(settings, shape["head_dim"]) != shape["head_dim"]:
        raise ModelLoadError("The file rotates part of each head (smollm3.rope.dimension_count "
                             "below the head size); SmolLM3 rotates whole heads. The file is "
                             "damaged: re-download it.")
    bias = settings.tensor_dims("blk.0.attn_q.bias") is not None
    return SmolLM3Config(
        **shape, rope_parameters=scaled_rope(settings),
        no_rope_layer_interval=GGUF_NO_ROPE_INTERVAL, use_sliding_window=False,
        attention_bias=bias, mlp_bias=settings.tensor_dims("blk.0.ffn_gate.bias") is not None)
