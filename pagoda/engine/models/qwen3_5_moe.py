"""The Qwen3.5 mixture-of-experts family (text; Qwen3.5-35B-A3B and larger): Qwen3.5's layers
(pagoda/engine/models/qwen3_5.py) with a sparse MLP in every layer: a router's softmax picks
each token's top num_experts_per_tok of num_experts, their weights renormalised to sum to 1,
beside a shared expert whose output is gated by a sigmoid.

It is released as a multimodal folder (model_type "qwen3_5_moe"), whose text model is run as
Qwen3.5's is: its config's text_config, its tensors under model.language_model. (registry.
TEXT_MODEL_OF); a text folder (qwen3_5_moe_text) holds the same tensors without the prefix. Both
may keep a layer's experts in transformers 5's two 3-D tensors (moe_folders).

llama.cpp's converter writes a qwen35moe GGUF file (`config_from_gguf`) as a qwen35 one (value
heads tiled over the key heads) with qwen3next's expert tensors.
"""

from __future__ import annotations

import dataclasses
import re

import torch
from transformers import PretrainedConfig, Qwen3_5MoeTextConfig

from pagoda.engine.layers.mlp import activation_of
from pagoda.engine.models import moe_folders, qwen3_5
from pagoda.engine.models.architecture import DecoderArchitecture, MoESpec
from pagoda.engine.models.config import routed_experts
from pagoda.engine.models.gguf_config import (
    GGUFSettings,
    count,
    llama_shape,
    rope_theta,
    rotary_dims,
)
from pagoda.engine.models.moe_gguf import expert_settings

NAME = "Qwen3.5-MoE"  # its entry in pagoda/engine/models/registry.py names the model types

# A text folder's fused experts, or any tensor of a multimodal folder's text model.
FOLDER_TENSORS = re.compile(f"{moe_folders.FOLDER_TENSORS.pattern}|{qwen3_5.FOLDER_TENSORS.pattern}")


def folder_weights(config: PretrainedConfig,
                   tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The text model's tensors under a text folder's names, each layer's fused experts split
    into the shared per-expert names."""
    text = {**{n: t for n, t in tensors.items() if not qwen3_5.FOLDER_TENSORS.fullmatch(n)},
            **qwen3_5.folder_weights(config, {n: t for n, t in tensors.items()
                                              if qwen3_5.FOLDER_TENSORS.fullmatch(n)})}
    experts = moe_folders.folder_weights(config, text)
    return {**{n: t for n, t in text.items()
               if not moe_folders.FOLDER_TENSORS.fullmatch(n)}, **experts}


def architecture(config: PretrainedConfig) -> DecoderArchitecture:
    tiled = bool(getattr(config, qwen3_5.TILED_VALUE_HEADS, False))
    return dataclasses.replace(qwen3_5.hybrid_architecture(config, NAME, "qwen3_5", tiled=tiled),
                               moe=_moe(config))


def _moe(config: PretrainedConfig) -> MoESpec:
    experts, top_k = routed_experts(config, "num_experts")
    shared = config.shared_expert_intermediate_size
    return MoESpec(
        num_experts=experts, top_k=top_k, intermediate_size=config.moe_intermediate_size,
        sparse_layers=frozenset(range(config.num_hidden_layers)), renormalize=True,
        shared_expert_size=shared, shared_expert_gate=bool(shared),
        activation=activation_of(config.hidden_act, NAME))


def config_from_gguf(settings: GGUFSettings) -> PretrainedConfig:
    """A qwen35moe file's config from its own keys, as llama.cpp reads them (its top k weights
    renormalised)."""
    shape = llama_shape(settings)
    size = shape["head_dim"]
    experts = expert_settings(settings, renormalized=True)
    del experts["norm_topk_prob"]  # Qwen3.5-MoE always renormalises (_moe)
    return Qwen3_5MoeTextConfig(
        **shape, **qwen3_5.delta_net_from_gguf(settings, tiled=True), **experts,
        hidden_act="silu",
        moe_intermediate_size=count(settings, "expert_feed_forward_length"),
        shared_expert_intermediate_size=count(settings, "expert_shared_feed_forward_length"),
        layer_types=qwen3_5.layer_types_from_gguf(settings, shape["num_hidden_layers"]),
        rope_parameters={"rope_type": "default", "rope_theta": rope_theta(settings),
                         "partial_rotary_factor": rotary_dims(settings, size) / size})
