"""The Granite 4 hybrid family (IBM's Granite-4.0-H-Micro, H-Tiny, H-Small; transformers'
granitemoehybrid): Mamba-2 layers beside attention layers. config.json's layer_types marks each
layer "mamba" or "attention" (transformers 5 renames them "linear_attention" and
"full_attention" on load); a mamba layer is a recurrent mixer (pagoda/engine/layers/mamba2.py)
with a convolution window and an SSM state per sequence, an attention layer Llama's, rotated
where position_embedding_type is "rope" and not at all (NoPE, as Granite 4.0-H) otherwise.

Every layer's MLP is `shared_mlp` (input_linear: gate and up stacked; output_linear), alone
where num_local_experts is 0, else beside a mixture of experts (block_sparse_moe: a router that
softmaxes its top k logits among themselves, every expert's gate|up and down in two 3-D tensors)
as an ungated shared expert. Granite's scalars: the embeddings times embedding_multiplier, the
attention scaled by attention_multiplier, each mixer's and MLP's output times
residual_multiplier before the residual add, the logits divided by logits_scaling. hidden_act
is the MLPs' activation and the convolution's, which the Mamba-2 mixer fixes to SiLU.

llama.cpp's converter writes a granitehybrid GGUF file (`config_from_gguf`): its attention
layers as those with key-value heads (attention.head_count_kv, 0 for a Mamba layer), the Mamba
sizes under ssm.* (time_step_rank is the heads), the scalars as attention.scale,
embedding_scale, residual_scale and logit_scale, and RoPE as on where rope.scaling.finetuned is
true or absent, as llama.cpp reads it (the converter writes false for every hybrid: llama.cpp
runs Granite 4 hybrids without RoPE, whatever position_embedding_type was). It writes neither
time_step_limit nor the scan's chunk: llama.cpp limits no time step.
"""

from __future__ import annotations

import math
import re
from dataclasses import replace

import torch
from transformers import GraniteMoeHybridConfig, PretrainedConfig

from pagoda.engine.errors import ModelLoadError
from pagoda.engine.layers.rotary import rope_spec
from pagoda.engine.models.architecture import (
    EXPERTS,
    ROUTER,
    SHARED_EXPERT,
    AttentionKind,
    DecoderArchitecture,
    Mamba2Kind,
    MoESpec,
    recurrent_state_floats,
)
from pagoda.engine.models.config import head_dim, model_shape, routed_experts
from pagoda.engine.models.gguf_config import (
    GGUFSettings,
    count,
    hybrid_kv_heads,
    llama_shape,
    number,
    rope_theta,
    rotary_dims,
)

NAME = "Granite 4 hybrid"  # its entry in pagoda/engine/models/registry.py names the model types

# The folder tensors `folder_weights` maps to the shared names (the loader reads them for it):
# the released checkpoints' names, and transformers 5's own (save_original_format=False).
FOLDER_TENSORS = re.compile(
    r"model\.layers\.\d+\.(?:shared_mlp\.(?:input|output)_linear\.weight"
    r"|block_sparse_moe\.(?:input_linear\.weight|output_linear\.weight|router\.layer\.weight"
    r"|router\.weight|experts\.gate_up_proj|experts\.down_proj))")
_FOLDER_TENSOR = re.compile(r"(model\.layers\.\d+\.)(shared_mlp|block_sparse_moe)\.(.+)")
_MLP = "mlp"  # a dense layer's gate_proj, up_proj, down_proj (LayerNames' defaults)


def architecture(config: PretrainedConfig) -> DecoderArchitecture:
    _refuse_other_activation(config)
    moe = _moe(config)
    # A dense layer's MLP is the shared one; a sparse layer's dense width is never read.
    shape = replace(model_shape(config), intermediate_size=config.shared_intermediate_size)
    mamba = _mamba_kind(config)
    attention, ropes = _attention_kind(config)
    layers = tuple(mamba if i in shape.recurrent_layers else attention
                   for i in range(shape.num_layers))
    return DecoderArchitecture(
        family=NAME, shape=replace(shape, state_floats=recurrent_state_floats(
            layers, shape.hidden_size)),
        layers=layers,
        ropes=ropes, attention_scale=_scalar(config, "attention_multiplier"),
        embedding_scale=_scalar(config, "embedding_multiplier"),
        residual_scale=_scalar(config, "residual_multiplier"),
        logit_divisor=_scalar(config, "logits_scaling"),
        tied_embeddings=bool(config.tie_word_embeddings),
        qkv_bias=bool(config.attention_bias), o_bias=bool(config.attention_bias), moe=moe)


def _refuse_other_activation(config: PretrainedConfig) -> None:
    if config.hidden_act != "silu":
        raise ModelLoadError(
            f"config.json's hidden_act is {config.hidden_act!r}: Granite applies it to its MLPs "
            "and to the Mamba layers' convolution, which Pagoda runs with SiLU only (as the "
            "released Granite 4 models do).")


def _scalar(config: PretrainedConfig, key: str) -> float | None:
    """A multiplier config.json states (None where it is 1: nothing to do)."""
    value = getattr(config, key, None)
    value = 1.0 if value is None else value
    if isinstance(value, bool) or not isinstance(value, int | float) or not value > 0:
        raise ModelLoadError(f"config.json's {key} is {value!r}, where a positive number is "
                             "needed. The model's settings are damaged.")
    return None if value == 1 else float(value)


def _attention_kind(config: PretrainedConfig) -> tuple[AttentionKind, dict]:
    """Llama's attention, rotated by RoPE where position_embedding_type is "rope", else NoPE
    (transformers' rule: anything but "rope" rotates nothing)."""
    kind = config.position_embedding_type
    if kind == "rope":
        return AttentionKind(), {"default": rope_spec(config, head_dim(config))}
    if kind not in (None, "nope"):
        raise ModelLoadError(f"config.json's position_embedding_type is {kind!r}: Pagoda runs "
                             "Granite's \"rope\" and \"nope\" (no positions in attention).")
    return AttentionKind(rope=None), {}


def _mamba_kind(config: PretrainedConfig) -> Mamba2Kind:
    heads, groups = config.mamba_n_heads, config.mamba_n_groups
    inner = config.mamba_expand * config.hidden_size
    if heads * config.mamba_d_head != inner or heads % groups:
        raise ModelLoadError(
            f"config.json's Mamba layers have {heads} heads of {config.mamba_d_head} "
            f"(mamba_n_heads, mamba_d_head) in {groups} groups (mamba_n_groups), for an inner "
            f"width of {inner} (mamba_expand x hidden_size): the heads must fill the width and "
            "the groups divide the heads. The model's settings are damaged.")
    if config.mamba_d_conv < 2:
        raise ModelLoadError(f"config.json's mamba_d_conv is {config.mamba_d_conv}: a "
                             "convolution of at least 2 taps is needed.")
    limit = tuple(config.time_step_limit or (0.0, math.inf))
    return Mamba2Kind(
        num_heads=heads, head_dim=config.mamba_d_head, state_size=config.mamba_d_state,
        n_groups=groups, conv_kernel=config.mamba_d_conv, chunk_size=config.mamba_chunk_size,
        time_step_limit=(float(limit[0]), float(limit[1])),
        conv_bias=bool(config.mamba_conv_bias), proj_bias=bool(config.mamba_proj_bias))


def _moe(config: PretrainedConfig) -> MoESpec | None:
    """Every layer sparse where the model has experts (none where num_local_experts is 0)."""
    if not config.num_local_experts:
        return None
    experts, top_k = routed_experts(config, "num_local_experts")
    return MoESpec(
        num_experts=experts, top_k=top_k, intermediate_size=config.intermediate_size,
        sparse_layers=frozenset(range(config.num_hidden_layers)), softmax_after_top_k=True,
        shared_expert_size=config.shared_intermediate_size)


def folder_weights(config: PretrainedConfig,
                   tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """FOLDER_TENSORS under the shared names, as views: shared_mlp's gate and up halves (a dense
    layer's MLP, else the shared expert), each expert's gate, up and down, the router."""
    shared = SHARED_EXPERT if config.num_local_experts else _MLP
    named: dict[str, torch.Tensor] = {}
    for name, tensor in tensors.items():
        layer, block, part = _FOLDER_TENSOR.fullmatch(name).groups()
        if block == "shared_mlp":
            named |= _shared_mlp(name, f"{layer}{shared}", part, tensor,
                                 config.shared_intermediate_size)
        elif part.startswith("router"):
            named[f"{layer}{ROUTER}.weight"] = tensor
        else:
            named |= _experts(name, layer, part, tensor, config)
    return named


def _shared_mlp(name: str, module: str, part: str, tensor: torch.Tensor,
                width: int) -> dict[str, torch.Tensor]:
    if part.startswith("output_linear"):
        return {f"{module}.down_proj.weight": tensor}
    if tensor.ndim != 2 or tensor.shape[0] != 2 * width:
        raise ModelLoadError(
            f"Tensor {name} has shape {tuple(tensor.shape)}, where config.json's "
            f"shared_intermediate_size ({width}) implies gate and up stacked: {2 * width} rows. "
            "The folder does not match its config: re-download the model.")
    return {f"{module}.gate_proj.weight": tensor[:width],
            f"{module}.up_proj.weight": tensor[width:]}


def _experts(name: str, layer: str, part: str, tensor: torch.Tensor,
             config: PretrainedConfig) -> dict[str, torch.Tensor]:
    """A layer's experts from its two 3-D tensors: [experts, 2 x width, hidden] (gate rows, then
    up) and [experts, hidden, width]."""
    width, experts = config.intermediate_size, config.num_local_experts
    gate_up = part in ("input_linear.weight", "experts.gate_up_proj")
    rows = 2 * width if gate_up else config.hidden_size
    if tensor.ndim != 3 or tensor.shape[:2] != (experts, rows):
        raise ModelLoadError(
            f"Tensor {name} has shape {tuple(tensor.shape)}, where config.json implies "
            f"{experts} experts (num_local_experts) of {rows} rows each. The folder does not "
            "match its config: re-download the model.")
    named = {}
    for e, matrix in enumerate(tensor):
        if gate_up:
            named[f"{layer}{EXPERTS}.{e}.gate_proj.weight"] = matrix[:width]
            named[f"{layer}{EXPERTS}.{e}.up_proj.weight"] = matrix[width:]
        else:
            named[f"{layer}{EXPERTS}.{e}.down_proj.weight"] = matrix
    return named


def config_from_gguf(settings: GGUFSettings) -> PretrainedConfig:
    """A granitehybrid file's config from its own keys, as llama.cpp reads them."""
    kv_heads = hybrid_kv_heads(settings, "Mamba layer")
    shape = llama_shape(settings, kv_heads=max(kv_heads))
    shape.pop("head_dim")  # Granite's heads are hidden / heads wide (its converter says so)
    attention = kv_heads.index(max(kv_heads))
    mamba = kv_heads.index(0) if 0 in kv_heads else 0
    return GraniteMoeHybridConfig(
        **shape, **_mamba_from_gguf(settings, shape["hidden_size"], mamba),
        **_mlp_from_gguf(settings, shape["intermediate_size"]),
        layer_types=["attention" if n else "mamba" for n in kv_heads],
        attention_bias=settings.tensor_dims(f"blk.{attention}.attn_q.bias") is not None,
        attention_multiplier=number(settings, "attention.scale", 1.0),
        embedding_multiplier=number(settings, "embedding_scale", 1.0),
        residual_multiplier=number(settings, "residual_scale", 1.0),
        logits_scaling=number(settings, "logit_scale", 1.0),
        position_embedding_type=_positions_from_gguf(settings, shape["hidden_size"]
                                                     // shape["num_attention_heads"]),
        rope_parameters={"rope_type": "default", "rope_theta": rope_theta(settings)})


def _positions_from_gguf(settings: GGUFSettings, head_dim: int) -> str:
    """"rope" unless rope.scaling.finetuned is false; a file that rotates part of each head
    (rope.dimension_count: Bamba's, which the same converter writes as granitehybrid) is refused,
    as Granite rotates whole heads."""
    finetuned = settings.metadata(f"{settings.architecture}.rope.scaling.finetuned")
    if finetuned not in (None, True, False):
        raise ModelLoadError(
            f"The file states {finetuned!r} for {settings.architecture}.rope.scaling.finetuned, "
            "where true or false (whether its attention layers use RoPE) is needed. The file "
            "is damaged: re-download it.")
    if finetuned is False:
        return "nope"
    rotated = rotary_dims(settings, head_dim)
    if rotated != head_dim:
        raise ModelLoadError(
            f"The file rotates {rotated} of each head's {head_dim} dimensions "
            f"({settings.architecture}.rope.dimension_count), as Bamba does: Pagoda runs "
            "Granite 4 hybrids, which rotate whole heads or none.")
    return "rope"


def _mamba_from_gguf(settings: GGUFSettings, hidden: int, layer: int) -> dict:
    """The Mamba layers' sizes (ssm.*) and biases (those of layer `layer`'s tensors)."""
    heads, inner = count(settings, "ssm.time_step_rank"), count(settings, "ssm.inner_size")
    if inner % heads or inner % hidden:
        raise ModelLoadError(
            f"The file states a Mamba inner width of {inner} ({settings.architecture}."
            f"ssm.inner_size) over {heads} heads (ssm.time_step_rank) for a width of {hidden}: "
            "the heads must divide it, and it must be a multiple of the width. The file is "
            "damaged: re-download it.")
    return {"mamba_n_heads": heads, "mamba_d_head": inner // heads,
            "mamba_expand": inner // hidden, "mamba_d_state": count(settings, "ssm.state_size"),
            "mamba_n_groups": count(settings, "ssm.group_count"),
            "mamba_d_conv": count(settings, "ssm.conv_kernel"),
            "mamba_conv_bias": settings.tensor_dims(f"blk.{layer}.ssm_conv1d.bias") is not None,
            "mamba_proj_bias": settings.tensor_dims(f"blk.{layer}.ssm_in.bias") is not None}


def _mlp_from_gguf(settings: GGUFSettings, feed_forward: int) -> dict:
    """The shared MLP's width (expert_shared_feed_forward_length; a dense file may state only
    feed_forward_length, as llama.cpp reads it), and the experts where the file has them
    (expert_count 0 or absent: a dense model)."""
    experts = settings.metadata(f"{settings.architecture}.expert_count")
    if experts in (None, 0):
        shared = count(settings, "expert_shared_feed_forward_length", default=feed_forward)
        return {"shared_intermediate_size": shared, "num_local_experts": 0}
    return {"shared_intermediate_size": count(settings, "expert_shared_feed_forward_length"),
            "num_local_experts": count(settings, "expert_count"),
            "num_experts_per_tok": count(settings, "expert_used_count")}
