"""The Qwen3-Next family (Qwen3-Next-80B-A3B): Qwen3.5's hybrid of Gated DeltaNets and gated
attention (pagoda/engine/models/qwen3_5.py), three DeltaNets to one attention layer, with
Qwen3-MoE's sparse MLPs: a router picks each token's top num_experts_per_tok of num_experts
(renormalised where norm_topk_prob says) beside a shared expert whose output is gated by a
sigmoid; layers in mlp_only_layers keep a dense MLP. Its DeltaNets' input projections are
in_proj_qkvz and in_proj_ba, grouped by key head (gated_delta_net_weights reorders their rows);
attention rotates partial_rotary_factor of each head by plain RoPE.

llama.cpp's converter writes a qwen3next GGUF file (`config_from_gguf`) as a qwen35 one, but
with in_proj_qkvz split into attn_qkv and attn_gate and in_proj_ba kept whole (ssm_ba), the
value heads in Hugging Face's order (not tiled): the config says so (SPLIT_PROJECTIONS). A
layer is sparse where it has a router (ffn_gate_inp), as llama.cpp reads it, and its top k
weights are renormalised."""

from __future__ import annotations

import dataclasses

from transformers import PretrainedConfig, Qwen3NextConfig

from pagoda.engine.models import moe_folders
from pagoda.engine.models.architecture import DecoderArchitecture
from pagoda.engine.models.gguf_config import (
    GGUFSettings,
    count,
    llama_shape,
    rope_theta,
    rotary_dims,
)
from pagoda.engine.models.moe_gguf import expert_settings
from pagoda.engine.models.qwen3_5 import (
    delta_net_from_gguf,
    hybrid_architecture,
    layer_types_from_gguf,
    model_layers,
)
from pagoda.engine.models.qwen3_moe import moe_spec

NAME = "Qwen3-Next"  # its entry in pagoda/engine/models/registry.py names the model types it covers

# Folders in transformers 5's own layout keep a layer's experts in two 3-D tensors.
FOLDER_TENSORS, folder_weights = moe_folders.FOLDER_TENSORS, moe_folders.folder_weights
# A config built from a GGUF file says so: its DeltaNets' projections are in_proj_qkv, in_proj_z
# and in_proj_ba (GatedDeltaNetKind's "qwen3_next_split" layout).
SPLIT_PROJECTIONS = "linear_projections_split"


def architecture(config: PretrainedConfig) -> DecoderArchitecture:
    layout = "qwen3_next_split" if getattr(config, SPLIT_PROJECTIONS, False) else "qwen3_next"
    return dataclasses.replace(hybrid_architecture(config, NAME, layout), moe=moe_spec(config))


def config_from_gguf(settings: GGUFSettings) -> PretrainedConfig:
    """A qwen3next file's config from its own keys, as llama.cpp reads them."""
    shape = llama_shape(settings) | {"num_hidden_layers": model_layers(settings)}
    layers, size = shape["num_hidden_layers"], shape["head_dim"]
    experts = expert_settings(settings, renormalized=True)
    return Qwen3NextConfig(
        **shape, **delta_net_from_gguf(settings, tiled=False), **experts, hidden_act="silu",
        moe_intermediate_size=count(settings, "expert_feed_forward_length"),
        shared_expert_intermediate_size=count(settings, "expert_shared_feed_forward_length"),
        decoder_sparse_step=1,
        mlp_only_layers=[i for i in range(layers)
                         if settings.tensor_dims(f"blk.{i}.ffn_gate_inp.weight") is None],
        layer_types=layer_types_from_gguf(settings, layers),
        rope_parameters={"rope_type": "default", "rope_theta": rope_theta(settings),
                         "partial_rotary_factor": rotary_dims(settings, size) / size},
        **{SPLIT_PROJECTIONS: True})
