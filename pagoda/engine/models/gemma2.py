"""The Gemma 2 family: windowed and global layers in turn (layer 0 windowed) over one RoPE base;
a norm on the attention's output and on the MLP's ("sandwich"); every norm scales by (1 + w);
GeGLU; embeddings times sqrt(hidden); attention scores and the final logits softcapped.

The attention softcap keeps decode steps out of the one-call C step (pagoda/engine/models/
native_decode.py falls back to the eager step for it).
"""

from __future__ import annotations

from transformers import Gemma2Config, PretrainedConfig

from pagoda.engine.errors import ModelLoadError
from pagoda.engine.layers.mlp import activation_of
from pagoda.engine.layers.rotary import rope_spec
from pagoda.engine.models.architecture import AttentionKind, DecoderArchitecture, LayerNames
from pagoda.engine.models.config import head_dim, model_shape
from pagoda.engine.models.gguf_config import GGUFSettings, count, llama_shape, number, scaled_rope

NAME = "Gemma 2"  # its entry in pagoda/engine/models/registry.py names the model types it covers

GEMMA2_NAMES = LayerNames(
    attention_out_norm="post_attention_layernorm", mlp_norm="pre_feedforward_layernorm",
    mlp_out_norm="post_feedforward_layernorm")

_SLIDING, _FULL = "sliding_attention", "full_attention"
# What llama.cpp assumes where a GGUF file does not say: a window of 4,096 keys, the caps of
# the released models, and the 46-layer 27B's attention scale from hidden / heads, not head_dim.
_GGUF_DEFAULT_WINDOW = 4096
_GGUF_DEFAULT_ATTENTION_CAP = 50.0
_GGUF_DEFAULT_FINAL_CAP = 30.0
_LAYERS_OF_27B = 46


def architecture(config: PretrainedConfig) -> DecoderArchitecture:
    if getattr(config, "use_bidirectional_attention", False):
        raise ModelLoadError(
            "This Gemma 2 model attends in both directions (use_bidirectional_attention: an "
            "embedding model), which Pagoda does not run: it runs causal text generation models.")
    shape = model_shape(config)
    bias = bool(getattr(config, "attention_bias", False))
    return DecoderArchitecture(
        family=NAME, shape=shape,
        layers=tuple(AttentionKind(window) for window in shape.layer_windows),
        ropes={"default": rope_spec(config, head_dim(config))},
        names=GEMMA2_NAMES,
        attention_scale=float(config.query_pre_attn_scalar) ** -0.5,
        norm_offset=1.0,
        activation=activation_of(getattr(config, "hidden_activation", None)
                                 or getattr(config, "hidden_act", None), NAME),
        embedding_scale=config.hidden_size ** 0.5,
        attention_softcap=config.attn_logit_softcapping,
        final_softcap=config.final_logit_softcapping,
        tied_embeddings=bool(config.tie_word_embeddings), qkv_bias=bias, o_bias=bias)


# A GGUF file's config


def config_from_gguf(settings: GGUFSettings) -> PretrainedConfig:
    """A gemma2 file's config from its own keys, as llama.cpp reads them, where transformers'
    reader would leave the attention scale and both softcaps at Gemma2Config's defaults."""
    shape = llama_shape(settings)
    layers = shape["num_hidden_layers"]
    pattern = settings.metadata("gemma2.attention.sliding_window_pattern")
    if pattern is not None:  # llama.cpp's Gemma 2 converter never writes one
        raise ModelLoadError(
            f"The file states {pattern!r} for gemma2.attention.sliding_window_pattern, which "
            "Gemma 2 files do not have (every other layer is windowed). The file is not a "
            "Gemma 2 model as llama.cpp's converter writes it.")
    rope = scaled_rope(settings)  # llama.cpp rotates every layer with it
    local_base = settings.metadata("gemma2.rope.freq_base_swa")
    if local_base is not None and number(settings, "rope.freq_base_swa", 1.0) != rope["rope_theta"]:
        raise ModelLoadError(
            f"The file gives Gemma 2's windowed layers a RoPE base of {local_base} beside "
            f"{rope['rope_theta']} for the global ones, which Gemma 2 does not have (one base "
            "for all layers).")
    # llama.cpp takes the scale from head_dim, or for the 27B from hidden / heads, whatever the
    # original query_pre_attn_scalar was (the file does not keep it).
    scalar = (shape["hidden_size"] // shape["num_attention_heads"] if layers == _LAYERS_OF_27B
              else shape["head_dim"])
    return Gemma2Config(
        **shape, hidden_activation="gelu_pytorch_tanh",
        sliding_window=count(settings, "attention.sliding_window", _GGUF_DEFAULT_WINDOW),
        layer_types=[_SLIDING if i % 2 == 0 else _FULL for i in range(layers)],
        rope_parameters=rope, query_pre_attn_scalar=scalar,
        attn_logit_softcapping=number(settings, "attn_logit_softcapping",
                                      _GGUF_DEFAULT_ATTENTION_CAP),
        final_logit_softcapping=number(settings, "final_logit_softcapping",
                                       _GGUF_DEFAULT_FINAL_CAP))
