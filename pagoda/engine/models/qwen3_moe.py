"""The Qwen3-MoE family (Qwen3-30B-A3B, Qwen3-235B-A22B) and Qwen2-MoE before it (Qwen1.5-MoE,
Qwen2-57B-A14B): Qwen3's (or Qwen2's) attention layers with sparse MLPs. A router picks each
token's top `num_experts_per_tok` of `num_experts` experts by softmax, renormalised where
`norm_topk_prob` says; layer i is sparse where i + 1 is a multiple of `decoder_sparse_step` and
i is not in `mlp_only_layers` (those keep a dense MLP of `intermediate_size`). Qwen2-MoE adds a
shared expert every token goes through, its output gated by a sigmoid."""

from __future__ import annotations

import dataclasses

from transformers import PretrainedConfig

from pagoda.engine.errors import ModelLoadError
from pagoda.engine.layers.mlp import activation_of
from pagoda.engine.models import llama, moe_folders
from pagoda.engine.models.architecture import DecoderArchitecture, MoESpec, sparse_layers
from pagoda.engine.models.config import routed_experts
from pagoda.engine.models.gguf_config import GGUFSettings
from pagoda.engine.models.moe_gguf import qwen2moe_config, qwen3moe_config

NAME = "Qwen3-MoE"  # its entry in pagoda/engine/models/registry.py names the model types it covers

# Folders in transformers 5's own layout keep a layer's experts in two 3-D tensors.
FOLDER_TENSORS, folder_weights = moe_folders.FOLDER_TENSORS, moe_folders.folder_weights


def architecture(config: PretrainedConfig) -> DecoderArchitecture:
    return dataclasses.replace(llama.architecture(config), family=NAME, moe=moe_spec(config))


def config_from_gguf(settings: GGUFSettings) -> PretrainedConfig:
    """A qwen3moe or qwen2moe file's config from its keys, routed as llama.cpp routes it."""
    return (qwen2moe_config if settings.architecture == "qwen2moe" else qwen3moe_config)(settings)


def moe_spec(config: PretrainedConfig) -> MoESpec:
    """The sparse MLPs of a Qwen2/3-MoE config (Qwen3-Next's too)."""
    layers = config.num_hidden_layers
    experts, top_k = routed_experts(config, "num_experts")
    every = config.decoder_sparse_step
    dense = list(config.mlp_only_layers or [])
    outside = [i for i in dense if not 0 <= i < layers]
    if every < 1 or outside:
        raise ModelLoadError(
            f"config.json's decoder_sparse_step ({every}) or mlp_only_layers ({dense}) name no "
            f"layers of its {layers}: a step of at least 1 and layers 0 to {layers - 1}. The "
            "model's settings are damaged.")
    shared = getattr(config, "shared_expert_intermediate_size", 0) or 0
    return MoESpec(
        num_experts=experts, top_k=top_k, intermediate_size=config.moe_intermediate_size,
        sparse_layers=sparse_layers(layers, every, dense),
        renormalize=bool(config.norm_topk_prob),
        shared_expert_size=shared, shared_expert_gate=bool(shared),
        activation=activation_of(config.hidden_act, NAME))
