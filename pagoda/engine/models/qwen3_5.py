"""The Qwen3.5 family (text): Gated DeltaNet layers beside gated attention. config.json's
layer_types marks each layer "linear_attention" (a Gated DeltaNet: pagoda/engine/layers/
gated_delta_net.py, three of every four layers in the released models) or "full_attention"
(Qwen3's attention with per-head q and k norms, its q_proj also giving a sigmoid gate on the
output per query channel). Every layer has a SwiGLU MLP. The decoder's RMSNorms and the q/k
norms scale by (1 + w), the DeltaNet's gated norm by its weight as it is.

Attention rotates partial_rotary_factor of each head (a quarter). Its "mrope" sections split the
rotated pairs among three position streams (time, height, width) that are equal for text, so
text rotates as plain RoPE over those dimensions.

Qwen3.5 is released as a multimodal folder (model_type "qwen3_5"): its text model's config is
text_config (registry.TEXT_MODEL_OF) and its weights are under model.language_model. (read
under the text model's names: `folder_weights`); the vision encoder (model.visual.) and the
multi-token prediction layers (mtp.) are not read, as Pagoda runs the text model alone.

llama.cpp's converter writes a qwen35 GGUF file (`config_from_gguf`): the DeltaNet sizes under
ssm.* (state_size is the key heads' width, group_count the key heads, time_step_rank the value
heads, inner_size their width), its recurrent layers as attention.recurrent_layers (or every
full_attention_interval-th layer attending), and each DeltaNet's value heads reordered so that
value head h reads key head h % key heads (`GatedDeltaNetKind.tiled`; the config says so by
TILED_VALUE_HEADS). The loader takes the tensors in that order, quantized or not.
"""

from __future__ import annotations

import re
from dataclasses import replace

import torch
from transformers import PretrainedConfig, Qwen3_5TextConfig

from pagoda.engine.errors import ModelLoadError
from pagoda.engine.layers.mlp import activation_of
from pagoda.engine.layers.rotary import rope_spec
from pagoda.engine.models.architecture import (
    AttentionKind,
    DecoderArchitecture,
    GatedDeltaNetKind,
    LayerNames,
    recurrent_state_floats,
)
from pagoda.engine.models.config import head_dim, model_shape
from pagoda.engine.models.gguf_config import (
    GGUFSettings,
    count,
    llama_shape,
    rope_theta,
    rotary_dims,
)

NAME = "Qwen3.5"  # its entry in pagoda/engine/models/registry.py names the model types it covers

NAMES = LayerNames(q_norm="self_attn.q_norm", k_norm="self_attn.k_norm")
# A multimodal folder's text model's tensors, which `folder_weights` names as a text folder's.
FOLDER_TENSORS = re.compile(r"model\.language_model\..+")
_TEXT_MODEL_PREFIX = "model.language_model."


def folder_weights(config: PretrainedConfig,
                   tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return {"model." + name[len(_TEXT_MODEL_PREFIX):]: tensor for name, tensor in tensors.items()}


# A config built from a GGUF file says so where its DeltaNets' value heads are tiled over the key
# heads (llama.cpp's converter's order) rather than grouped by them (Hugging Face's).
TILED_VALUE_HEADS = "linear_value_heads_tiled"


def architecture(config: PretrainedConfig) -> DecoderArchitecture:
    return hybrid_architecture(config, NAME, "qwen3_5",
                               tiled=bool(getattr(config, TILED_VALUE_HEADS, False)))


def hybrid_architecture(config: PretrainedConfig, family: str, layout: str,
                        tiled: bool = False) -> DecoderArchitecture:
    """Qwen3.5's and Qwen3-Next's layers (`layout`: their DeltaNets' input projections), a
    dense MLP in each; Qwen3-Next's module adds its experts."""
    if config.attention_bias:
        raise ModelLoadError(
            f"config.json sets attention_bias: {family}'s gated attention runs without biases "
            "in Pagoda (the released models have none).")
    shape = model_shape(config)
    delta_net = delta_net_kind(config, layout, tiled)
    layers = tuple(delta_net if i in shape.recurrent_layers else AttentionKind(output_gate=True)
                   for i in range(shape.num_layers))
    return DecoderArchitecture(
        family=family,
        shape=replace(shape, state_floats=recurrent_state_floats(layers, shape.hidden_size)),
        layers=layers, ropes={"default": rope_spec(config, head_dim(config))}, names=NAMES,
        norm_offset=1.0, activation=activation_of(config.hidden_act, family),
        tied_embeddings=bool(config.tie_word_embeddings),
        mtp_like=max((i for i in range(shape.num_layers) if i not in shape.recurrent_layers),
                     default=None))


def delta_net_kind(config: PretrainedConfig, layout: str, tiled: bool) -> GatedDeltaNetKind:
    k_heads, v_heads = config.linear_num_key_heads, config.linear_num_value_heads
    if v_heads % k_heads:
        raise ModelLoadError(
            f"config.json's Gated DeltaNet has {v_heads} value heads (linear_num_value_heads) "
            f"for {k_heads} key heads (linear_num_key_heads): each key head must serve a whole "
            "number of value heads. The model's settings are damaged.")
    if config.linear_conv_kernel_dim < 2:
        raise ModelLoadError(f"config.json's linear_conv_kernel_dim is "
                             f"{config.linear_conv_kernel_dim}: a convolution of at least 2 "
                             "taps is needed.")
    if config.hidden_act != "silu":
        raise ModelLoadError(
            f"config.json's hidden_act is {config.hidden_act!r}: the Gated DeltaNet's "
            "convolution and gate use it, which Pagoda runs with SiLU only (as the released "
            "models do).")
    return GatedDeltaNetKind(
        num_k_heads=k_heads, num_v_heads=v_heads, k_dim=config.linear_key_head_dim,
        v_dim=config.linear_value_head_dim, conv_kernel=config.linear_conv_kernel_dim,
        layout=layout, tiled=tiled)


def config_from_gguf(settings: GGUFSettings) -> PretrainedConfig:
    """A qwen35 file's config from its own keys, as llama.cpp reads them."""
    shape = llama_shape(settings) | {"num_hidden_layers": model_layers(settings)}
    size = shape["head_dim"]
    return Qwen3_5TextConfig(
        **shape, **delta_net_from_gguf(settings, tiled=True), hidden_act="silu",
        layer_types=layer_types_from_gguf(settings, shape["num_hidden_layers"]),
        rope_parameters={"rope_type": "default", "rope_theta": rope_theta(settings),
                         "partial_rotary_factor": rotary_dims(settings, size) / size})


def model_layers(settings: GGUFSettings) -> int:
    """The file's blocks less its multi-token-prediction blocks (nextn_predict_layers), which
    the converter writes after the model's layers (pagoda.engine.models.mtp)."""
    blocks = count(settings, "block_count")
    extra = count(settings, "nextn_predict_layers", default=0)
    if extra >= blocks:
        raise ModelLoadError(
            f"The file states {extra} multi-token-prediction blocks "
            f"({settings.architecture}.nextn_predict_layers) of {blocks} blocks in all: "
            "that leaves the model no layers. The file is damaged: re-download it.")
    return blocks - extra


def delta_net_from_gguf(settings: GGUFSettings, tiled: bool) -> dict:
    """The DeltaNets' sizes (ssm.*); tiled: their value heads as the converter writes qwen35's
    (not qwen3next's)."""
    k_heads, v_heads = count(settings, "ssm.group_count"), count(settings, "ssm.time_step_rank")
    inner = count(settings, "ssm.inner_size")
    if inner % v_heads or v_heads % k_heads:
        raise ModelLoadError(
            f"The file states {v_heads} value heads (ssm.time_step_rank) of an inner width of "
            f"{inner} (ssm.inner_size) over {k_heads} key heads (ssm.group_count): the value "
            "heads must divide the width and the key heads the value heads. The file is "
            "damaged: re-download it.")
    return {"linear_num_key_heads": k_heads, "linear_num_value_heads": v_heads,
            "linear_key_head_dim": count(settings, "ssm.state_size"),
            "linear_value_head_dim": inner // v_heads,
            "linear_conv_kernel_dim": count(settings, "ssm.conv_kernel"),
            TILED_VALUE_HEADS: tiled}


def layer_types_from_gguf(settings: GGUFSettings, layers: int) -> list[str]:
    """attention.recurrent_layers (a flag per layer), else every full_attention_interval-th
    layer attending (4 where the file says neither, as llama.cpp assumes)."""
    key = f"{settings.architecture}.attention.recurrent_layers"
    flags = settings.metadata(key)
    if flags is None:
        every = count(settings, "full_attention_interval", default=4)
        flags = [(i + 1) % every != 0 for i in range(layers)]
    if isinstance(flags, list) and len(flags) == count(settings, "block_count"):
        flags = flags[:layers]  # the multi-token-prediction blocks' flags follow the model's
    if not isinstance(flags, list) or len(flags) != layers:
        raise ModelLoadError(f"The file's {key} names {flags!r} for a model of {layers} "
                             "layers, where one flag per layer is needed. The file is damaged: "
                             "re-download it.")
    return ["linear_attention" if flag else "full_attention" for flag in flags]
