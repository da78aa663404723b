"""The Gemma 3 family: five windowed layers to one global, each kind with its own RoPE
base; per-head q/k norms; a norm on the attention's output and on the MLP's ("sandwich");
every norm scales by (1 + w); GeGLU; embeddings times sqrt(hidden); the final logits softcapped.

Decode steps run in the one-call C step on CPU (pagoda/engine/models/native_decode.py), which covers
these layers too.

Gemma 3 4B and larger are released as multimodal folders (model_type "gemma3"): the text model's
config is text_config (registry.TEXT_MODEL_OF), its weights under language_model.model. (or
model.language_model. as transformers 5 names its own modules: `folder_weights`), its SigLIP
tower and projector beside them (pagoda/engine/models/vision_tower.py).
"""

from __future__ import annotations

from transformers import Gemma3TextConfig, PretrainedConfig

from pagoda.engine.errors import ModelLoadError
from pagoda.engine.layers.mlp import activation_of
from pagoda.engine.layers.rotary import rope_spec
from pagoda.engine.models import text_model_folders
from pagoda.engine.models.architecture import AttentionKind, DecoderArchitecture, LayerNames
from pagoda.engine.models.config import head_dim, layer_types, model_shape
from pagoda.engine.models.gguf_config import GGUFSettings, count, llama_shape, number, scaled_rope

NAME = "Gemma 3"  # its entry in pagoda/engine/models/registry.py names the model types it covers

# A multimodal folder's text model's tensors (pagoda/engine/models/text_model_folders.py).
FOLDER_TENSORS = text_model_folders.FOLDER_TENSORS
folder_weights = text_model_folders.folder_weights


GEMMA3_NAMES = LayerNames(
    attention_out_norm="post_attention_layernorm", mlp_norm="pre_feedforward_layernorm",
    mlp_out_norm="post_feedforward_layernorm", q_norm="self_attn.q_norm",
    k_norm="self_attn.k_norm")

_SLIDING, _FULL = "sliding_attention", "full_attention"
# What llama.cpp assumes where a GGUF file does not say: every sixth layer global, a local RoPE
# base of 10,000, and the 62-layer 27B's attention scale from hidden / heads, not head_dim.
_GGUF_DEFAULT_PATTERN = 6
_GGUF_DEFAULT_LOCAL_BASE = 10000.0
_LAYERS_OF_27B = 62


def architecture(config: PretrainedConfig) -> DecoderArchitecture:
    _refuse_what_is_not_run(config)
    shape = model_shape(config)
    kinds = layer_types(config)
    size = head_dim(config)
    bias = bool(getattr(config, "attention_bias", False))
    return DecoderArchitecture(
        family=NAME, shape=shape,
        layers=tuple(AttentionKind(window, kind)
                     for window, kind in zip(shape.layer_windows, kinds, strict=True)),
        ropes={kind: rope_spec(config, size, kind) for kind in sorted(set(kinds))},
        names=GEMMA3_NAMES,
        attention_scale=float(config.query_pre_attn_scalar) ** -0.5,
        norm_offset=1.0,
        activation=activation_of(_activation_name(config), NAME),
        embedding_scale=config.hidden_size ** 0.5,
        final_softcap=config.final_logit_softcapping,
        tied_embeddings=bool(config.tie_word_embeddings), qkv_bias=bias, o_bias=bias)


def _activation_name(config: PretrainedConfig) -> str | None:
    return getattr(config, "hidden_activation", None) or getattr(config, "hidden_act", None)


def _refuse_what_is_not_run(config: PretrainedConfig) -> None:
    cap = getattr(config, "attn_logit_softcapping", None)
    if cap is not None:
        raise ModelLoadError(
            f"This Gemma 3 model's config.json sets attn_logit_softcapping ({cap}), which "
            "transformers' Gemma 3 never applies and llama.cpp's converter refuses (released "
            "Gemma 3 models leave it unset), so whether the model was trained with it is "
            "unknown. Remove the setting if the model was trained or run with transformers.")
    if getattr(config, "use_bidirectional_attention", False):
        raise ModelLoadError(
            "This Gemma 3 model attends in both directions (use_bidirectional_attention: an "
            "embedding model such as EmbeddingGemma), which Pagoda does not run: it runs "
            "causal text generation models.")


# A GGUF file's config


def config_from_gguf(settings: GGUFSettings) -> PretrainedConfig:
    """A gemma3 file's config from its own keys, as llama.cpp reads them, where transformers'
    reader would leave the layer pattern, the local RoPE base, the attention scale and the final
    softcap at Gemma3TextConfig's defaults."""
    shape = llama_shape(settings)
    layers = shape["num_hidden_layers"]
    window = settings.metadata("gemma3.attention.sliding_window")  # 0 or absent: none
    windowed = (_windowed_layers(settings.metadata("gemma3.attention.sliding_window_pattern"),
                                 layers) if window else [False] * layers)
    # llama.cpp takes the scale from head_dim, or for the 27B from hidden / heads, whatever the
    # original query_pre_attn_scalar was (the file does not keep it).
    scalar = (shape["hidden_size"] // shape["num_attention_heads"] if layers == _LAYERS_OF_27B
              else shape["head_dim"])
    # gemma3.attn_logit_softcapping is not read, as llama.cpp's gemma3 does not read it: its
    # model saver writes that key (50 by default) into files of every architecture.
    cap = settings.metadata("gemma3.final_logit_softcapping")
    return Gemma3TextConfig(
        **shape, hidden_activation="gelu_pytorch_tanh",
        sliding_window=count(settings, "attention.sliding_window") if window else None,
        layer_types=[_SLIDING if swa else _FULL for swa in windowed],
        rope_parameters={
            _SLIDING: {"rope_type": "default",
                       "rope_theta": number(settings, "rope.freq_base_swa",
                                            _GGUF_DEFAULT_LOCAL_BASE)},
            _FULL: scaled_rope(settings)},  # llama.cpp scales the global layers alone
        query_pre_attn_scalar=scalar,
        final_logit_softcapping=number(settings, "final_logit_softcapping", 0.0) if cap else None)


def _windowed_layers(pattern: object, layers: int) -> list[bool]:
    """Which layers are windowed: the file's list of one flag per layer, or its period n
    (each n-th layer global; 0: every layer windowed), or llama.cpp's default period of 6."""
    if isinstance(pattern, list):
        if len(pattern) != layers:
            raise ModelLoadError(
                f"The file's gemma3.attention.sliding_window_pattern names {len(pattern)} layers "
                f"for a model of {layers}. The file is damaged: re-download it.")
        return [bool(flag) for flag in pattern]
    if pattern is None:
        pattern = _GGUF_DEFAULT_PATTERN
    if isinstance(pattern, bool) or not isinstance(pattern, int) or pattern < 0:
        raise ModelLoadError(
            f"The file states {pattern!r} for gemma3.attention.sliding_window_pattern, where a "
            "period or one flag per layer is needed. The file is damaged: re-download it.")
    return [pattern == 0 or i % pattern < pattern - 1 for i in range(layers)]
