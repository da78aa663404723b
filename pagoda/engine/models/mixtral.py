"""The Mixtral family (Mixtral 8x7B, 8x22B): Mistral's layers with a sparse MLP in every layer.
A router picks each token's top `num_experts_per_tok` of `num_local_experts` experts (each as
wide as `intermediate_size`) by softmax, their weights renormalised to sum to 1. Mixtral's own
checkpoints name them block_sparse_moe.gate and block_sparse_moe.experts.E.w1/w3/w2 (gate, up,
down), which the loader reads under the shared names (pagoda/engine/models/moe_folders.py)."""

from __future__ import annotations

import dataclasses

from transformers import PretrainedConfig

from pagoda.engine.layers.mlp import activation_of
from pagoda.engine.models import llama, moe_folders
from pagoda.engine.models.architecture import DecoderArchitecture, MoESpec
from pagoda.engine.models.config import routed_experts

NAME = "Mixtral"  # its entry in pagoda/engine/models/registry.py names the model types it covers

FOLDER_TENSORS, folder_weights = moe_folders.FOLDER_TENSORS, moe_folders.folder_weights


def architecture(config: PretrainedConfig) -> DecoderArchitecture:
    experts, top_k = routed_experts(config, "num_local_experts")
    moe = MoESpec(
        num_experts=experts, top_k=top_k, intermediate_size=config.intermediate_size,
        sparse_layers=frozenset(range(config.num_hidden_layers)), renormalize=True,
        activation=activation_of(config.hidden_act, NAME))
    return dataclasses.replace(llama.architecture(config), family=NAME, moe=moe)
