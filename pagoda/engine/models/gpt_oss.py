"""The gpt-oss family (gpt-oss-20b, gpt-oss-120b): windowed (128 keys) and full layers in turn,
layer 0 windowed; q, k, v and o with biases; attention sinks (a learned logit per query head in
each softmax's denominator); YaRN RoPE; every MLP a mixture of experts whose router has a bias
and keeps the k best logits, softmaxed among themselves, and whose experts have biases and a
clamped SwiGLU ((up + 1) * gate * sigmoid(1.702 * gate), gate at most 7, up within +-7).

A folder keeps each layer's experts as transformers' fused 3-D tensors: `gate_up_proj`
[experts, hidden, 2 x width] with gate and up columns interleaved (gate even, up odd) and
`down_proj` [experts, width, hidden], both stored input-major, and the router as `mlp.router`.
They are mapped here to the shared per-expert names (pagoda/engine/models/architecture.py).

A GGUF file (llama.cpp's `gpt-oss`) states neither the SwiGLU's constants nor which layers are
windowed: llama.cpp fixes them (1.702 and 7; every other layer windowed, layer 0 first), and
truncates YaRN's correction range to whole dimensions, where transformers' gpt-oss does not:
a file's config says so, so that it runs as llama.cpp runs it.
"""

from __future__ import annotations

import re

import torch
from transformers import GptOssConfig, PretrainedConfig

from pagoda.engine.errors import ModelLoadError
from pagoda.engine.layers.rotary import rope_spec
from pagoda.engine.models.architecture import (
    EXPERTS,
    ROUTER,
    AttentionKind,
    DecoderArchitecture,
    LayerNames,
    MoESpec,
)
from pagoda.engine.models.config import head_dim, model_shape, routed_experts
from pagoda.engine.models.gguf_config import GGUFSettings, count, llama_shape, scaled_rope
from pagoda.engine.models.moe_gguf import expert_settings

NAME = "gpt-oss"  # its entry in pagoda/engine/models/registry.py names the model types it covers

GPT_OSS_NAMES = LayerNames(sinks="self_attn.sinks")

# What llama.cpp fixes for every gpt-oss file (its LLM_FFN_SWIGLU_OAI_MOE and swa pattern).
_SWIGLU_ALPHA, _SWIGLU_LIMIT = 1.702, 7.0
_SLIDING, _FULL = "sliding_attention", "full_attention"

# A folder's own names of a layer's router and fused experts (transformers' GptOssMLP).
FOLDER_TENSORS = re.compile(
    r"model\.layers\.(\d+)\.mlp\.(router\.weight|router\.bias|experts\.gate_up_proj"
    r"|experts\.gate_up_proj_bias|experts\.down_proj|experts\.down_proj_bias)")


def architecture(config: PretrainedConfig) -> DecoderArchitecture:
    shape = model_shape(config)
    bias = bool(getattr(config, "attention_bias", True))
    experts, top_k = routed_experts(config, "num_local_experts")
    moe = MoESpec(
        num_experts=experts, top_k=top_k, intermediate_size=config.intermediate_size,
        sparse_layers=frozenset(range(shape.num_layers)), softmax_after_top_k=True,
        router_bias=True, expert_bias=True, activation="swiglu_oai",
        swiglu_limit=float(config.swiglu_limit), swiglu_alpha=float(config.swiglu_alpha))
    return DecoderArchitecture(
        family=NAME, shape=shape,
        layers=tuple(AttentionKind(window) for window in shape.layer_windows),
        ropes={"default": rope_spec(config, head_dim(config))},
        names=GPT_OSS_NAMES, tied_embeddings=bool(config.tie_word_embeddings),
        qkv_bias=bias, o_bias=bias, moe=moe)


# A folder's weights


def folder_weights(config: PretrainedConfig,
                   tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The folder's routers and fused experts (`FOLDER_TENSORS`, all of them) under the shared
    names: each expert's gate, up and down as [rows, columns] matrices (output-major, as every
    linear here is) and its biases."""
    weights: dict[str, torch.Tensor] = {}
    for name, tensor in tensors.items():
        layer, part = FOLDER_TENSORS.fullmatch(name).groups()
        prefix = f"model.layers.{layer}."
        if part.startswith("router."):
            weights[f"{prefix}{ROUTER}.{part.removeprefix('router.')}"] = tensor
            continue
        _check_experts(name, tensor, config)
        for e, expert in enumerate(tensor):
            weights |= _expert_weights(f"{prefix}{EXPERTS}.{e}.", part, expert)
    return weights


def _expert_weights(prefix: str, part: str, tensor: torch.Tensor) -> dict[str, torch.Tensor]:
    """One expert's slice of a fused tensor under its shared names."""
    if part == "experts.gate_up_proj":  # [hidden, 2 x width], gate and up interleaved
        return {f"{prefix}gate_proj.weight": tensor[:, 0::2].T.contiguous(),
                f"{prefix}up_proj.weight": tensor[:, 1::2].T.contiguous()}
    if part == "experts.gate_up_proj_bias":
        return {f"{prefix}gate_proj.bias": tensor[0::2].contiguous(),
                f"{prefix}up_proj.bias": tensor[1::2].contiguous()}
    if part == "experts.down_proj":  # [width, hidden]
        return {f"{prefix}down_proj.weight": tensor.T.contiguous()}
    return {f"{prefix}down_proj.bias": tensor}


def _check_experts(name: str, tensor: torch.Tensor, config: PretrainedConfig) -> None:
    """A fused tensor holds one matrix (or bias) per expert, of the config's sizes: a folder
    whose tensors say otherwise is refused before it is sliced."""
    experts, hidden, width = config.num_local_experts, config.hidden_size, config.intermediate_size
    want = {"gate_up_proj": (experts, hidden, 2 * width), "gate_up_proj_bias": (experts, 2 * width),
            "down_proj": (experts, width, hidden), "down_proj_bias": (experts, hidden)}
    expected = want[name.rsplit(".", 1)[1]]
    if tuple(tensor.shape) != expected:
        raise ModelLoadError(
            f"Tensor {name} has shape {tuple(tensor.shape)}, but config.json implies {expected} "
            f"({experts} experts of width {width} over a hidden size of {hidden}). The weights "
            "do not match the config; re-download the model.")


# A GGUF file's config


def config_from_gguf(settings: GGUFSettings) -> PretrainedConfig:
    """A gpt-oss file's config from its own keys, as llama.cpp reads them."""
    experts = expert_settings(settings, renormalized=False)
    width = count(settings, "expert_feed_forward_length")
    shape = llama_shape(settings, intermediate=width)
    layers = shape["num_hidden_layers"]
    if settings.metadata("gpt-oss.attention.sliding_window_pattern") is not None:
        raise ModelLoadError(
            "The file states gpt-oss.attention.sliding_window_pattern, which llama.cpp's "
            "converter never writes for gpt-oss (every other layer is windowed). Pagoda does "
            "not run this file.")
    rope = scaled_rope(settings)
    if rope["rope_type"] == "yarn":
        rope["truncate"] = True  # llama.cpp rounds YaRN's correction range to whole dimensions
    return GptOssConfig(
        **shape, num_local_experts=experts["num_experts"],
        num_experts_per_tok=experts["num_experts_per_tok"],
        sliding_window=count(settings, "attention.sliding_window"),
        layer_types=[_SLIDING if i % 2 == 0 else _FULL for i in range(layers)],
        rope_parameters=rope, attention_bias=True,
        swiglu_alpha=_SWIGLU_ALPHA, swiglu_limit=_SWIGLU_LIMIT)
