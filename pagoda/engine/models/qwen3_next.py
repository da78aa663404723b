"""The Qwen3-Next family (Qwen3-Next-80B-A3B): Qwen3.5's hybrid of Gated DeltaNets and gated
attention (pagoda/engine/models/qwen3_5.py), three DeltaNets to one attention layer, with
Qwen3-MoE's sparse MLPs: a router picks each token's top num_experts_per_tok of num_experts
(renormalised where norm_topk_prob says) beside a shared expert whose output is gated by a
sigmoid; layers in mlp_only_layers keep a dense MLP. Its DeltaNets' input projections are
in_proj_qkvz and in_proj_ba, grouped by key head (gated_delta_net_weights reorders their rows);
attention rotates partial_rotary_factor of each head by plain RoPE."""

from __future__ import annotations

import dataclasses

from transformers import PretrainedConfig

from pagoda.engine.models import moe_folders
from pagoda.engine.models.architecture import DecoderArchitecture
from pagoda.engine.models.qwen3_5 import hybrid_architecture
from pagoda.engine.models.qwen3_moe import moe_spec

NAME = "Qwen3-Next"  # its entry in pagoda/engine/models/registry.py names the model types it covers

# Folders in transformers 5's own layout keep a layer's experts in two 3-D tensors.
FOLDER_TENSORS, folder_weights = moe_folders.FOLDER_TENSORS, moe_folders.folder_weights


def architecture(config: PretrainedConfig) -> DecoderArchitecture:
    return dataclasses.replace(hybrid_architecture(config, NAME, "qwen3_next"),
                               moe=moe_spec(config))
