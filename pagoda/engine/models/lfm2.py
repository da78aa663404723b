"""The LFM2 family (Liquid AI's LFM2-350M, 700M, 1.2B, 2.6B): a hybrid of gated short
convolutions and attention. config.json's layer_types (or full_attn_idxs) marks each layer
"conv" or "full_attention"; a conv layer is a recurrent mixer with a state of its last
conv_L_cache - 1 inputs per sequence (pagoda/engine/layers/short_conv.py), an attention layer
a Llama one with per-head q and k norms and its output projection named out_proj. Every layer
has a SwiGLU MLP (feed_forward.w1/w3/w2) whose width config.json may state before an
adjustment (block_auto_adjust_ff_dim), and the last norm is model.embedding_norm.

llama.cpp's converter writes an lfm2 GGUF file's attention layers as those with key-value heads
(attention.head_count_kv, a list with 0 for a convolution), the MLP's adjusted width, and the
convolutions' taps as [channels, kernel] (`config_from_gguf`).
"""

from __future__ import annotations

from dataclasses import replace

from transformers import Lfm2Config, PretrainedConfig

from pagoda.engine.errors import ModelLoadError
from pagoda.engine.layers.rotary import rope_spec
from pagoda.engine.models.architecture import (
    AttentionKind,
    DecoderArchitecture,
    LayerNames,
    ShortConvKind,
    recurrent_state_floats,
)
from pagoda.engine.models.config import head_dim, model_shape
from pagoda.engine.models.gguf_config import (
    GGUFSettings,
    count,
    hybrid_kv_heads,
    llama_shape,
    rope_theta,
)

NAME = "LFM2"  # its entry in pagoda/engine/models/registry.py names the model types it covers

_NAMES = LayerNames(
    qkv=("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"), o="self_attn.out_proj",
    gate_up=("feed_forward.w1", "feed_forward.w3"), down="feed_forward.w2",
    input_norm="operator_norm", mlp_norm="ffn_norm",
    q_norm="self_attn.q_layernorm", k_norm="self_attn.k_layernorm")


def architecture(config: PretrainedConfig) -> DecoderArchitecture:
    # Its norms' epsilon is norm_eps; an rms_norm_eps beside it is not LFM2's.
    shape = replace(model_shape(config), intermediate_size=mlp_width(config),
                    rms_norm_eps=config.norm_eps)
    kernel = config.conv_L_cache
    if not isinstance(kernel, int) or kernel < 2:
        raise ModelLoadError(f"config.json's conv_L_cache is {kernel!r}: a short convolution "
                             "of at least 2 taps is needed. The model's settings are damaged.")
    conv = ShortConvKind(kernel, bias=bool(config.conv_bias))
    layers = tuple(conv if i in shape.recurrent_layers else AttentionKind(window)
                   for i, window in enumerate(shape.layer_windows))
    return DecoderArchitecture(
        family=NAME, shape=replace(shape, state_floats=recurrent_state_floats(
            layers, shape.hidden_size)),
        layers=layers,
        ropes={"default": rope_spec(config, head_dim(config))},
        names=_NAMES, final_norm="model.embedding_norm",
        tied_embeddings=bool(config.tie_word_embeddings))


def mlp_width(config: PretrainedConfig) -> int:
    """The MLP's width as Hugging Face's Lfm2MLP builds it: with block_auto_adjust_ff_dim,
    2/3 of intermediate_size, times block_ffn_dim_multiplier, rounded up to a multiple of
    block_multiple_of."""
    width = config.intermediate_size
    if not config.block_auto_adjust_ff_dim:
        return width
    width = int(2 * width / 3)
    if config.block_ffn_dim_multiplier is not None:
        width = int(config.block_ffn_dim_multiplier * width)
        multiple = config.block_multiple_of
        width = multiple * ((width + multiple - 1) // multiple)
    return width


def config_from_gguf(settings: GGUFSettings) -> PretrainedConfig:
    """An lfm2 file's config from its own keys, as llama.cpp reads them: a layer attends where
    attention.head_count_kv gives it key-value heads (one count for those), else it is a short
    convolution of shortconv.l_cache taps; feed_forward_length is the MLP's width as it is."""
    kv_heads = hybrid_kv_heads(settings, "convolution")
    shape = llama_shape(settings, kv_heads=max(kv_heads))
    eps = shape.pop("rms_norm_eps")
    shape.pop("head_dim")  # LFM2's heads are hidden / heads wide, as its config derives them
    return Lfm2Config(
        **shape, norm_eps=eps, conv_L_cache=count(settings, "shortconv.l_cache"),
        conv_bias=settings.tensor_dims("blk.0.shortconv.in_proj.bias") is not None,
        block_auto_adjust_ff_dim=False,
        layer_types=["full_attention" if n else "conv" for n in kv_heads],
        rope_parameters={"rope_type": "default", "rope_theta": rope_theta(settings)})
