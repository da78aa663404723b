"""The one table of GGUF tensor names: which GGUF tensor holds each Hugging Face parameter, per
architecture, as llama.cpp's converter (convert_hf_to_gguf.py) writes them.

Most architectures share the Llama names; an architecture lists only where it differs. The trap
this table exists for: Gemma's `post_attention_layernorm` is the norm on the attention's output
(GGUF `post_attention_norm`), where Llama's is the norm before the MLP (GGUF `ffn_norm`).
"""

from __future__ import annotations

import re

_GLOBAL = {"model.embed_tokens": "token_embd", "model.norm": "output_norm", "lm_head": "output",
           # Gemma 4's per-layer embeddings (E2B, E4B)
           "model.embed_tokens_per_layer": "per_layer_token_embd",
           "model.per_layer_model_projection": "per_layer_model_proj",
           "model.per_layer_projection_norm": "per_layer_proj_norm",
           "model.embedding_norm": "token_embd_norm"}  # LFM2's last norm
_LAYER = {
    "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v",
    "self_attn.o_proj": "attn_output", "self_attn.q_norm": "attn_q_norm",
    "self_attn.k_norm": "attn_k_norm", "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up",
    "mlp.down_proj": "ffn_down", "input_layernorm": "attn_norm",
    "post_attention_layernorm": "ffn_norm",
    # A multi-token-prediction block's own tensors, in the block after the model's layers
    # (pagoda.engine.models.mtp: its fc and norms, as the converter names them in that block).
    "eh_proj": "nextn.eh_proj", "enorm": "nextn.enorm", "hnorm": "nextn.hnorm",
    "shared_head.norm": "nextn.shared_head_norm",
    # A sparse MLP (pagoda/engine/models/architecture.py's names): the router, each of gate, up and down
    # as one 3-D tensor of every expert's matrix ([experts, rows, columns]), the shared expert.
    "mlp.gate": "ffn_gate_inp", "mlp.experts.gate_proj": "ffn_gate_exps",
    "mlp.experts.up_proj": "ffn_up_exps", "mlp.experts.down_proj": "ffn_down_exps",
    "mlp.shared_expert.gate_proj": "ffn_gate_shexp", "mlp.shared_expert.up_proj": "ffn_up_shexp",
    "mlp.shared_expert.down_proj": "ffn_down_shexp", "mlp.shared_expert_gate": "ffn_gate_inp_shexp",
}
# Where an architecture's names differ from the Llama ones above.
_GEMMA_NORMS = {"post_attention_layernorm": "post_attention_norm",
                "pre_feedforward_layernorm": "ffn_norm",
                "post_feedforward_layernorm": "post_ffw_norm"}
_QWEN35_LAYERS = {"post_attention_layernorm": "post_attention_norm",
                  "linear_attn.in_proj_qkv": "attn_qkv", "linear_attn.in_proj_z": "attn_gate",
                  "linear_attn.in_proj_b": "ssm_beta", "linear_attn.in_proj_a": "ssm_alpha",
                  "linear_attn.conv1d": "ssm_conv1d", "linear_attn.norm": "ssm_norm",
                  "linear_attn.out_proj": "ssm_out"}
_LAYER_BY_ARCHITECTURE: dict[str, dict[str, str]] = {
    "gemma2": _GEMMA_NORMS,
    "gemma3": _GEMMA_NORMS,
    # Gemma 4's layer_scalar (a parameter without a suffix; its tensor is "<name>.weight") and
    # per-layer inputs.
    "gemma4": _GEMMA_NORMS | {"layer_scalar": "layer_output_scale",
                              "per_layer_input_gate": "inp_gate",
                              "per_layer_projection": "proj",
                              "post_per_layer_input_norm": "post_norm"},
    # Phi-3's fused q/k/v and gate/up matrices, as one tensor each.
    "phi3": {"self_attn.qkv_proj": "attn_qkv", "mlp.gate_up_proj": "ffn_up"},
    # gpt-oss's norm before the MLP, and its attention sinks (a parameter without a suffix).
    "gpt-oss": {"post_attention_layernorm": "post_attention_norm", "self_attn.sinks": "attn_sinks"},
    # LFM2's own names, and its short convolutions (the taps [channels, kernel], squeezed).
    "lfm2": {"operator_norm": "attn_norm", "ffn_norm": "ffn_norm",
             "feed_forward.w1": "ffn_gate", "feed_forward.w3": "ffn_up",
             "feed_forward.w2": "ffn_down", "self_attn.out_proj": "attn_output",
             "self_attn.q_layernorm": "attn_q_norm", "self_attn.k_layernorm": "attn_k_norm",
             "conv.in_proj": "shortconv.in_proj", "conv.conv": "shortconv.conv",
             "conv.out_proj": "shortconv.out_proj"},
    # Granite 4 hybrids' Mamba-2 layers (their per-head parameters: _LAYER_PARAMETERS).
    "granitehybrid": {"mamba.in_proj": "ssm_in", "mamba.conv1d": "ssm_conv1d",
                      "mamba.norm": "ssm_norm", "mamba.out_proj": "ssm_out"},
    # Qwen3.5's norm before the MLP, and its Gated DeltaNets (value heads tiled by the
    # converter: pagoda/engine/models/qwen3_5.py).
    "qwen35": _QWEN35_LAYERS,
    "qwen35moe": _QWEN35_LAYERS,
    # Qwen3-Next's: its in_proj_qkvz split by the converter into attn_qkv and attn_gate (value
    # heads not reordered), in_proj_ba as it is.
    "qwen3next": _QWEN35_LAYERS | {"linear_attn.in_proj_ba": "ssm_ba"},
}
# Layer parameters without a ".weight" or ".bias" suffix, by architecture: their whole GGUF
# names within blk.N. (Granite's A_log, D and dt_bias; the converter renames dt_bias a bias).
_LAYER_PARAMETERS: dict[str, dict[str, str]] = {
    "granitehybrid": {"mamba.A_log": "ssm_a", "mamba.D": "ssm_d", "mamba.dt_bias": "ssm_dt.bias"},
    "qwen35": {"linear_attn.A_log": "ssm_a", "linear_attn.dt_bias": "ssm_dt.bias"},
    "qwen35moe": {"linear_attn.A_log": "ssm_a", "linear_attn.dt_bias": "ssm_dt.bias"},
    "qwen3next": {"linear_attn.A_log": "ssm_a", "linear_attn.dt_bias": "ssm_dt.bias"},
}
# The layer modules every file of an architecture holds (biases and a separate output matrix
# vary, and are checked against the config later).
_LLAMA_MODULES = ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
                  "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj", "input_layernorm",
                  "post_attention_layernorm")
_QK_NORMS = ("self_attn.q_norm", "self_attn.k_norm")
_DENSE_MLP = ("mlp.gate_proj", "mlp.up_proj", "mlp.down_proj")
_SPARSE_MLP = ("mlp.gate", "mlp.experts.gate_proj", "mlp.experts.up_proj",
               "mlp.experts.down_proj")
_SHARED_EXPERT = ("mlp.shared_expert.gate_proj", "mlp.shared_expert.up_proj",
                  "mlp.shared_expert.down_proj", "mlp.shared_expert_gate")
_GEMMA_MODULES = _LLAMA_MODULES + _QK_NORMS + ("pre_feedforward_layernorm",
                                               "post_feedforward_layernorm")


def _sparse(modules: tuple[str, ...]) -> tuple[str, ...]:
    """A layer's modules with its dense MLP replaced by a router and experts."""
    return tuple(m for m in modules if m not in _DENSE_MLP) + _SPARSE_MLP


_NEEDED_MODULES: dict[str, tuple[str, ...]] = {
    "llama": _LLAMA_MODULES,
    "qwen2": _LLAMA_MODULES,
    "qwen2vl": _LLAMA_MODULES,  # Qwen2-VL's and Qwen2.5-VL's language models
    "qwen3": _LLAMA_MODULES + _QK_NORMS,
    "gemma2": tuple(m for m in _GEMMA_MODULES if m not in _QK_NORMS),
    "gemma3": _GEMMA_MODULES,
    # Gemma 4's global layers may have no v_proj (their values are the keys' projection), and
    # layers that read another's KV cache no k_proj or k_norm: the config says which, and the
    # loader checks the file against it.
    "gemma4": tuple(m for m in _GEMMA_MODULES
                    if m not in ("self_attn.k_proj", "self_attn.v_proj", "self_attn.k_norm")),
    "phi3": ("self_attn.qkv_proj", "self_attn.o_proj", "mlp.gate_up_proj", "mlp.down_proj",
             "input_layernorm", "post_attention_layernorm"),
    "smollm3": _LLAMA_MODULES,
    # Every layer sparse, as llama.cpp runs these (it reads no dense layers from such a file).
    "qwen3moe": _sparse(_LLAMA_MODULES + _QK_NORMS),
    "qwen2moe": _sparse(_LLAMA_MODULES) + _SHARED_EXPERT,
    "gpt-oss": _sparse(_LLAMA_MODULES) + ("self_attn.sinks",),
    # A layer's mixer (attention or short convolution) is the config's to say.
    "lfm2": ("operator_norm", "ffn_norm", "feed_forward.w1", "feed_forward.w3", "feed_forward.w2"),
    # Its mixer (attention or Mamba-2) and MLP (dense, or experts beside a shared expert) too.
    "granitehybrid": ("input_layernorm", "post_attention_layernorm"),
    "qwen35": ("input_layernorm", "post_attention_layernorm", *_DENSE_MLP),
    # Its MLPs (experts, or dense where a layer has no router) are the config's to say.
    "qwen3next": ("input_layernorm", "post_attention_layernorm"),
    # Experts in every layer, beside a gated shared expert.
    "qwen35moe": ("input_layernorm", "post_attention_layernorm", *_SPARSE_MLP, *_SHARED_EXPERT),
}
# The last norm, where an architecture's is not model.norm.
_FINAL_NORMS = {"lfm2": "model.embedding_norm"}
# llama.cpp's converter interleaves the rotary halves of each q and k head for these
# architectures (Llama's own RoPE kernel pairs neighbours); the loader turns them back.
# SmolLM3's converter derives from Llama's and permutes every layer's, its NoPE layers' too.
# Granite's hybrid converter derives from Llama's too (and permutes its NoPE layers').
PERMUTED_QK = frozenset({"llama", "smollm3", "granitehybrid"})
# llama.cpp's converter writes these architectures' norm weights as 1 + w (Gemma's RMSNorm
# scales by 1 + w, llama.cpp's by the weight): every tensor whose Hugging Face name ends in
# "norm.weight" but NORMS_HELD_AS_W. The loader gives back w, so a file and a folder load the
# same model.
NORMS_HOLD_ONE_PLUS_W = frozenset({"gemma2", "gemma3", "qwen35", "qwen35moe", "qwen3next"})
# Norms of those architectures that scale by w and are written as they are: Qwen3.5's and
# Qwen3-Next's gated norm in their Gated DeltaNets.
NORMS_HELD_AS_W = ("linear_attn.norm.weight",)
# llama.cpp's converter writes these architectures' A_log (Mamba-2's, Gated DeltaNet's) as
# A = -exp(A_log) (ssm_a): the loader gives back A_log.
A_LOG_HELD_AS_A = frozenset({"granitehybrid", "qwen35", "qwen35moe", "qwen3next"})

_LAYER_PARAMETER = re.compile(r"model\.layers\.(\d+)\.(.+?)(?:\.(weight|bias))?")
_EXPERT_PARAMETER = re.compile(r"model\.layers\.(\d+)\.mlp\.experts\.(\d+)\.(\w+)\.(weight|bias)")
_GLOBAL_PARAMETER = re.compile(r"(.+)\.(weight|bias)")


def gguf_tensor_name(hf_name: str, architecture: str = "llama") -> str:
    """"model.layers.3.mlp.up_proj.weight" -> "blk.3.ffn_up.weight"."""
    layer = _LAYER_PARAMETER.fullmatch(hf_name)
    if layer is not None:
        index, module, kind = layer.groups()
        whole = _LAYER_PARAMETERS.get(architecture, {}).get(module)
        if kind is None and whole is not None:
            return f"blk.{index}.{whole}"
        names = _LAYER_BY_ARCHITECTURE.get(architecture, {})
        return f"blk.{index}.{names.get(module) or _LAYER[module]}.{kind or 'weight'}"
    module, kind = _GLOBAL_PARAMETER.fullmatch(hf_name).groups()
    return f"{_GLOBAL[module]}.{kind}"


def gguf_expert_slice(hf_name: str, architecture: str = "llama") -> tuple[str, int] | None:
    """"model.layers.3.mlp.experts.5.up_proj.weight" -> ("blk.3.ffn_up_exps.weight", 5): the
    3-D tensor that holds an expert's matrix, and its index there; None for other names."""
    expert = _EXPERT_PARAMETER.fullmatch(hf_name)
    if expert is None:
        return None
    layer, index, module, kind = expert.groups()
    stacked = f"model.layers.{layer}.mlp.experts.{module}.{kind}"
    return gguf_tensor_name(stacked, architecture), int(index)


def final_norm_name(architecture: str) -> str:
    """The Hugging Face name of the model's last norm weight."""
    return f"{_FINAL_NORMS.get(architecture, 'model.norm')}.weight"


def needed_layer_modules(architecture: str, experts: bool = False) -> tuple[str, ...]:
    """The Hugging Face module names (within model.layers.N.) every layer of such a file has;
    with experts, of a Llama-named file whose layers are sparse (Mixtral's "llama" files)."""
    modules = _NEEDED_MODULES[architecture]
    return _sparse(modules) if experts and _DENSE_MLP[0] in modules else modules
