"""The Qwen3.5 mixture-of-experts family (text; Qwen3.5-35B-A3B and larger): Qwen3.5's layers
(pagoda/engine/models/qwen3_5.py) with a sparse MLP in every layer: a router's softmax picks
each token's top num_experts_per_tok of num_experts, their weights renormalised to sum to 1,
beside a shared expert whose output is gated by a sigmoid.

Its GGUF files (qwen35moe) are not read yet: llama.cpp's converter refused the tiny test
model's tokenizer (an unrecognised pre-tokenizer), so no file was at hand to test a reader on.
"""

from __future__ import annotations

import dataclasses

from transformers import PretrainedConfig

from pagoda.engine.layers.mlp import activation_of
from pagoda.engine.models import moe_folders
from pagoda.engine.models.architecture import DecoderArchitecture, MoESpec
from pagoda.engine.models.config import routed_experts
from pagoda.engine.models.qwen3_5 import hybrid_architecture

NAME = "Qwen3.5-MoE"  # its entry in pagoda/engine/models/registry.py names the model types

# Folders in transformers 5's own layout keep a layer's experts in two 3-D tensors.
FOLDER_TENSORS, folder_weights = moe_folders.FOLDER_TENSORS, moe_folders.folder_weights


def architecture(config: PretrainedConfig) -> DecoderArchitecture:
    return dataclasses.replace(hybrid_architecture(config, NAME, "qwen3_5"), moe=_moe(config))


def _moe(config: PretrainedConfig) -> MoESpec:
    experts, top_k = routed_experts(config, "num_experts")
    shared = config.shared_expert_intermediate_size
    return MoESpec(
        num_experts=experts, top_k=top_k, intermediate_size=config.moe_intermediate_size,
        sparse_layers=frozenset(range(config.num_hidden_layers)), renormalize=True,
        shared_expert_size=shared, shared_expert_gate=bool(shared),
        activation=activation_of(config.hidden_act, NAME))

