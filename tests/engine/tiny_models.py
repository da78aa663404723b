"""Tiny random-weight models, built with transformers' own classes, saved as complete HF folders.

For session-scoped fixtures, e.g.
    save_tiny_model(tmp_path_factory.mktemp("qwen2"), "qwen2")
The folder holds config.json, model.safetensors, generation_config.json and the default model's
tokenizer (with its chat template), so both Pagoda and `transformers` load it as they would a
downloaded model.
"""

from __future__ import annotations

import functools
import json
import struct
from pathlib import Path

import numpy as np
import torch
import transformers

from pagoda.engine.loading.loader import tokenizer_folder

TINY_MODEL_TYPES = ("llama", "qwen2", "mistral", "qwen3")
# Further variants of those types, by name: save_tiny_model(path, "qwen3-tied").
TINY_VARIANTS = (*TINY_MODEL_TYPES, "qwen3-tied", "llama3-rope")
# The families of issue 52, also converted to GGUF by llama.cpp and recorded against it
# (tests/engine/data/llama_cpp/). Apart from TINY_VARIANTS until the engine runs them.
FAMILY_VARIANTS = ("gemma2", "gemma3", "gemma3-query-scalar", "gemma4", "gemma4-e2b", "phi3", "phi3-longrope",
                   "smollm3", "gpt-oss", "qwen3moe", "qwen3moe-dense-layers", "qwen2moe",
                   "mixtral")

# Hybrid families (issue 56): recurrent layers beside attention; those llama.cpp runs as
# transformers does are recorded too (llama_cpp_converter.LLAMA_CPP_HYBRID_VARIANTS).
HYBRID_VARIANTS = ("lfm2", "granite-hybrid", "granite-hybrid-moe", "granite-hybrid-moe-rope",
                   "qwen3.5", "qwen3-next", "qwen3.5-moe")

_MODEL_CLASSES = {
    "lfm2": transformers.Lfm2ForCausalLM,
    "granitemoehybrid": transformers.GraniteMoeHybridForCausalLM,
    "qwen3_5_text": transformers.Qwen3_5ForCausalLM,
    "qwen3_next": transformers.Qwen3NextForCausalLM,
    "qwen3_5_moe_text": transformers.Qwen3_5MoeForCausalLM,
    "llama": transformers.LlamaForCausalLM,
    "qwen2": transformers.Qwen2ForCausalLM,
    "mistral": transformers.MistralForCausalLM,
    "qwen3": transformers.Qwen3ForCausalLM,
    "gemma2": transformers.Gemma2ForCausalLM,
    "gemma3_text": transformers.Gemma3ForCausalLM,
    "gemma4_text": transformers.Gemma4ForCausalLM,
    "phi3": transformers.Phi3ForCausalLM,
    "smollm3": transformers.SmolLM3ForCausalLM,
    "gpt_oss": transformers.GptOssForCausalLM,
    "qwen3_moe": transformers.Qwen3MoeForCausalLM,
    "qwen2_moe": transformers.Qwen2MoeForCausalLM,
    "mixtral": transformers.MixtralForCausalLM,
}
# Llama is tied like SmolLM2; qwen2 (q/k/v bias) and mistral exercise a separate lm_head.
# The rope thetas differ so that reading the wrong one shows up in parity tests.
_VARIANTS = {
    "llama": {"tie_word_embeddings": True, "rope_theta": 100000.0},
    "qwen2": {"tie_word_embeddings": False, "rope_theta": 1000000.0},
    "mistral": {"tie_word_embeddings": False, "rope_theta": 10000.0, "sliding_window": None},
    # Qwen3 normalises q and k per head; a head_dim of 32 (not hidden / heads = 16) shows up in
    # every q, k, v, o and norm shape.
    "qwen3": {"tie_word_embeddings": False, "rope_theta": 1000000.0, "head_dim": 32},
    "qwen3-tied": {"model_type": "qwen3", "tie_word_embeddings": True, "rope_theta": 1000000.0,
                   "head_dim": 32},
    # Llama 3.1's rope scaling over an original context of 64 tokens: wavelengths beyond 16
    # tokens are stretched, so all but the fastest of the 8 frequencies change.
    "llama3-rope": {"model_type": "llama", "tie_word_embeddings": True, "rope_theta": 500000.0,
                    "rope_parameters": {"rope_type": "llama3", "factor": 8.0,
                                        "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                        "original_max_position_embeddings": 64}},
    # Gemma 2 as its 2B is built, smaller: head_dim 32 beside hidden / heads = 16, layers 0 and 2
    # windowed (8 tokens, so the window cuts into every test prompt), 1 and 3 global, one RoPE
    # base: the released 10,000, as llama.cpp's converter writes none and llama.cpp assumes it.
    # The attention cap of 5 binds on these scores (the released 50 would not), the final one of
    # 8 on these logits. query_pre_attn_scalar equals head_dim as llama.cpp assumes.
    "gemma2": {"num_hidden_layers": 4, "head_dim": 32, "query_pre_attn_scalar": 32,
               "sliding_window": 8, "attn_logit_softcapping": 5.0,
               "final_logit_softcapping": 8.0, "tie_word_embeddings": True,
               "rope_theta": 10000.0},
    # Gemma 3 as its 270M is built: one KV head (MQA), head_dim 32 beside hidden / heads = 16,
    # layers 0-4 windowed (8 tokens, so the window cuts into every test prompt) and layer 5
    # global, each kind with its own RoPE base (neither the default). GeGLU and the (1 + w) norms
    # come with the class. query_pre_attn_scalar equals head_dim because llama.cpp does not
    # read it (it takes 1/sqrt(head_dim), or hidden / heads for the 62-layer 27B); the
    # "-query-scalar" variant below sets another, for parity with transformers only.
    # attn_logit_softcapping stays unset: Gemma 3 dropped it (transformers' Gemma3Attention never
    # applies it and llama.cpp's converter refuses a config that sets it). The final softcap is
    # honoured by both; it cannot move an argmax but shows in every logit and logprob.
    "gemma3": {"model_type": "gemma3_text", "num_hidden_layers": 6, "num_key_value_heads": 1,
               "head_dim": 32, "query_pre_attn_scalar": 32, "sliding_window": 8,
               "final_logit_softcapping": 8.0, "tie_word_embeddings": True,
               "rope_parameters": {
                   "sliding_attention": {"rope_type": "default", "rope_theta": 1000.0},
                   "full_attention": {"rope_type": "default", "rope_theta": 100000.0}}},
    # Gemma 4 as its 31B is built, smaller: windowed layers (8 tokens) of head_dim 32 over two
    # KV heads, global layers (2 and 5) of their own head_dim 96 over one KV head (so a token's
    # keys take another size there: 96 floats, not 64), whose values are their keys' projection
    # (attention_k_eq_v) and which rotate a quarter of their pairs ("proportional" RoPE); each
    # kind with its own base. No per-layer embeddings and no shared KV caches (the E2B/E4B
    # models' features, which Pagoda refuses).
    "gemma4": {"model_type": "gemma4_text", "num_hidden_layers": 6, "num_key_value_heads": 2,
               "head_dim": 32, "global_head_dim": 96, "num_global_key_value_heads": 1,
               "attention_k_eq_v": True, "sliding_window": 8, "hidden_size_per_layer_input": 0,
               "final_logit_softcapping": 8.0, "tie_word_embeddings": True,
               "layer_types": ["sliding_attention"] * 2 + ["full_attention"]
               + ["sliding_attention"] * 2 + ["full_attention"],
               "rope_parameters": {
                   "sliding_attention": {"rope_type": "default", "rope_theta": 1000.0},
                   "full_attention": {"rope_type": "proportional", "rope_theta": 100000.0,
                                      "partial_rotary_factor": 0.25}}},
    # Gemma 4 as its E2B is built: per-layer embeddings (16 wide per layer) and the last two
    # layers (4: windowed, 5: global) reading the KV caches of layers 2 and 3, with MLPs twice
    # as wide; global layers of their own head_dim (96) with their own v_proj (no k_eq_v). The
    # last layer before the sharing ones is global and the one before it windowed, as in the
    # E2B: llama.cpp takes the shared caches from those two whatever the layer types say.
    "gemma4-e2b": {"based_on": "gemma4", "attention_k_eq_v": False,
                   "num_global_key_value_heads": None, "hidden_size_per_layer_input": 16,
                   "num_kv_shared_layers": 2, "use_double_wide_mlp": True,
                   "layer_types": ["sliding_attention"] * 3 + ["full_attention",
                                                                "sliding_attention",
                                                                "full_attention"]},
    # Phi-4-mini's layout: fused qkv and gate_up, tied, 3/4 of each head rotated (12 of 16 dims).
    "phi3": {"tie_word_embeddings": True, "original_max_position_embeddings": 512,
             "rope_parameters": {"rope_type": "default", "rope_theta": 50000.0,
                                 "partial_rotary_factor": 0.75}},
    # ...and its longrope: short factors within an original context of 256 tokens, long ones past
    # it, with the attention factor of a 16x longer context. llama.cpp picks the long factors when
    # its context (-c, padded to 256) exceeds 256 tokens; transformers when the sequence does.
    "phi3-longrope": {"model_type": "phi3", "tie_word_embeddings": False,
                      "max_position_embeddings": 4096, "original_max_position_embeddings": 256,
                      "rope_parameters": {"rope_type": "longrope", "rope_theta": 50000.0,
                                          "partial_rotary_factor": 0.75,
                                          "original_max_position_embeddings": 256,
                                          "short_factor": [1.0, 1.1, 1.3, 1.6, 2.0, 2.5],
                                          "long_factor": [1.0, 1.5, 3.0, 6.0, 12.0, 24.0]}},
    # Gemma 3 27B's scaling (by a query_pre_attn_scalar other than head_dim), as transformers has it.
    "gemma3-query-scalar": {"based_on": "gemma3", "query_pre_attn_scalar": 48},
    # SmolLM3: layer 3 of 4 has no RoPE (transformers' and llama.cpp's every-4th rule).
    "smollm3": {"num_hidden_layers": 4, "tie_word_embeddings": True, "rope_theta": 2000000.0},
    # gpt-oss as its 20B is built, smaller: layers 0 and 2 windowed (8 keys, so the window cuts
    # into every test prompt), 1 and 3 full; 8 experts of width 32, top 2; sinks, biases and
    # the released YaRN (factor 32 over 4,096 positions, base 150,000).
    "gpt-oss": {"model_type": "gpt_oss", "num_hidden_layers": 4, "head_dim": 16,
                "intermediate_size": 32, "num_local_experts": 8, "num_experts_per_tok": 2,
                "sliding_window": 8, "tie_word_embeddings": False,
                "max_position_embeddings": 4096,
                "rope_parameters": {"rope_type": "yarn", "rope_theta": 150000.0, "factor": 32.0,
                                    "beta_fast": 32.0, "beta_slow": 1.0, "truncate": False,
                                    "original_max_position_embeddings": 4096}},
    # Qwen3-30B-A3B's layout, smaller: 16 experts of width 32, each token to 4, renormalised;
    # every layer sparse, as llama.cpp's converter wants.
    "qwen3moe": {"model_type": "qwen3_moe", "num_hidden_layers": 3, "head_dim": 32,
                 "num_experts": 16, "num_experts_per_tok": 4, "moe_intermediate_size": 32,
                 "norm_topk_prob": True, "tie_word_embeddings": False, "rope_theta": 1000000.0},
    # ...and dense layers among the sparse ones: every second layer sparse
    # (decoder_sparse_step 2: 1, 3, 5) but layer 3 (mlp_only_layers), the dense ones 128 wide;
    # 8 experts, top 2, not renormalised.
    "qwen3moe-dense-layers": {"based_on": "qwen3moe", "num_hidden_layers": 6, "num_experts": 8,
                              "num_experts_per_tok": 2, "norm_topk_prob": False,
                              "decoder_sparse_step": 2, "mlp_only_layers": [3]},
    # Qwen1.5-MoE's layout: q/k/v biases, 8 experts of width 32, top 2 (not renormalised), and
    # a shared expert 48 wide behind its sigmoid gate.
    "qwen2moe": {"model_type": "qwen2_moe", "num_hidden_layers": 3, "num_experts": 8,
                 "num_experts_per_tok": 2, "moe_intermediate_size": 32,
                 "shared_expert_intermediate_size": 48, "tie_word_embeddings": False,
                 "rope_theta": 1000000.0},
    # LFM2 as its 1.2B is built, smaller: short convolutions of 3 taps (conv_L_cache) in layers
    # 0, 2, 3 and 5, attention (per-head q/k norms) in 1 and 4 (layer_types); the MLP width
    # adjusted from intermediate_size (2/3 of 200, rounded up to 32: 160); a norm epsilon of its
    # own name (norm_eps) unlike the rms_norm_eps every tiny config also states, so that reading
    # the wrong one fails parity.
    "lfm2": {"num_hidden_layers": 6, "intermediate_size": 200, "block_multiple_of": 32,
             "conv_L_cache": 3, "norm_eps": 1e-3, "tie_word_embeddings": True,
             "rope_theta": 1000000.0,
             "layer_types": ["conv", "full_attention", "conv", "conv", "full_attention", "conv"]},
    # Granite 4.0-H as its Micro is built, smaller: Mamba-2 layers (8 heads of 16, 2 groups of
    # state 16, 4 taps; scan chunks of 8 in transformers, so its prompts span several) in 0, 2,
    # 3 and 5, NoPE attention in 1 and 4, a dense MLP (shared_mlp, 96 wide); Granite's scalars
    # away from 1 as the released ones are (embeddings x 12, residual branches x 0.22, logits /
    # 3, attention scaled by 0.2 rather than 1/sqrt(16)).
    "granite-hybrid": {"model_type": "granitemoehybrid", "num_hidden_layers": 6,
                       "layer_types": ["mamba", "attention", "mamba", "mamba", "attention",
                                       "mamba"],
                       # no experts routed, as the released dense H-Micro says (llama.cpp
                       # refuses a file routing 2 of 0 experts, transformers' default),
                       # and an intermediate_size that is the MLP's width, as there: llama.cpp
                       # sizes a dense file's MLP by it, transformers by the shared one's)
                       "num_local_experts": 0, "num_experts_per_tok": 0,
                       "intermediate_size": 96, "shared_intermediate_size": 96,
                       "mamba_n_heads": 8, "mamba_d_head": 16, "mamba_d_state": 16,
                       "mamba_n_groups": 2, "mamba_d_conv": 4, "mamba_expand": 2,
                       "mamba_chunk_size": 8, "position_embedding_type": "nope",
                       "embedding_multiplier": 12.0, "residual_multiplier": 0.22,
                       "logits_scaling": 3.0, "attention_multiplier": 0.2,
                       "tie_word_embeddings": True},
    # ...and as its H-Tiny/H-Small are built: 8 experts of width 32, top 2, beside a shared
    # expert 48 wide; untied.
    "granite-hybrid-moe": {"based_on": "granite-hybrid", "num_local_experts": 8,
                           "num_experts_per_tok": 2, "intermediate_size": 32,
                           "shared_intermediate_size": 48, "tie_word_embeddings": False},
    # ...the same rotated by RoPE (position_embedding_type "rope"; llama.cpp runs a Granite
    # hybrid without RoPE, so this one is for transformers' parity only), with biases in its
    # Mamba projections and attention.
    "granite-hybrid-moe-rope": {"based_on": "granite-hybrid-moe",
                                "position_embedding_type": "rope", "rope_theta": 10000.0,
                                "mamba_proj_bias": True, "attention_bias": True},
    # Qwen3.5 as its 0.8B is built, smaller: 8 layers, a Gated DeltaNet (2 key heads of 16, 4
    # value heads of 16, 4 taps) in three of every four, gated attention (4 heads of 16, 2 KV
    # heads, q/k norms) in 3 and 7, rotating a quarter of each head; the rotary sections must
    # fit its 2 rotated pairs (the converter writes [11, 11, 10] for none); untied.
    "qwen3.5": {"model_type": "qwen3_5_text", "num_hidden_layers": 8, "head_dim": 16,
                "linear_num_key_heads": 2, "linear_num_value_heads": 4,
                "linear_key_head_dim": 16, "linear_value_head_dim": 16,
                "linear_conv_kernel_dim": 4, "tie_word_embeddings": False,
                "rope_theta": 10000.0,
                "rope_parameters": {"partial_rotary_factor": 0.25, "mrope_section": [1, 1, 0],
                                    "mrope_interleaved": True}},
    # Qwen3-Next as its 80B-A3B is built, smaller: Qwen3.5's layers (its DeltaNets' projections
    # grouped by key head: in_proj_qkvz, in_proj_ba), plain partial RoPE, and in every layer 8
    # experts of width 32, top 2 renormalised, beside a shared expert 48 wide and its gate.
    "qwen3-next": {"based_on": "qwen3.5", "model_type": "qwen3_next",
                   "rope_parameters": {"partial_rotary_factor": 0.25},
                   "num_experts": 8, "num_experts_per_tok": 2, "moe_intermediate_size": 32,
                   "shared_expert_intermediate_size": 48, "norm_topk_prob": True,
                   "decoder_sparse_step": 1, "mlp_only_layers": []},
    # Qwen3.5-MoE as its 35B-A3B is built, smaller: the tiny Qwen3.5 with 8 experts of width
    # 32 (top 2, always renormalised) beside a shared expert 48 wide and its gate.
    "qwen3.5-moe": {"based_on": "qwen3.5", "model_type": "qwen3_5_moe_text", "num_experts": 8,
                    "num_experts_per_tok": 2, "moe_intermediate_size": 32,
                    "shared_expert_intermediate_size": 48},
    # Mixtral's layout: 8 experts of width 64 (intermediate_size), top 2, renormalised.
    "mixtral": {"num_hidden_layers": 3, "num_local_experts": 8, "num_experts_per_tok": 2,
                "intermediate_size": 64, "tie_word_embeddings": False, "sliding_window": None,
                "rope_theta": 1000000.0},
}
# Released Granite 4 hybrids name their layer types "mamba" and "attention" (transformers 5
# renames them on load and saves its own names); llama.cpp's converter reads only the former.
_LEGACY_LAYER_TYPES = frozenset({"granite-hybrid", "granite-hybrid-moe",
                                 "granite-hybrid-moe-rope"})
# Drawn from numpy's stream as FAMILY_VARIANTS are, not transformers' initialisation (whose
# Mamba A_log, D and dt_bias are the same every layer): numpy's PCG64 gives every CPU the same
# weights, so the converter's file hashes as the one llama.cpp's tokens were recorded on.
_NUMPY_WEIGHTS = frozenset(FAMILY_VARIANTS) | _LEGACY_LAYER_TYPES | {
    "lfm2", "qwen3.5", "qwen3-next", "qwen3.5-moe"}
# Released checkpoints of these variants keep rope_theta and rope_scaling at the top level of
# config.json (transformers 4.x's layout); the saved folder is rewritten that way.
_LEGACY_ROPE_LAYOUT = frozenset({"llama3-rope"})
# llama.cpp's Phi-3 converter reads the tokenizer as GPT-2 byte-level BPE only when
# tokenizer_config.json names GPT2Tokenizer (as Phi-4's does), else it wants a sentencepiece
# tokenizer.model. The default model's tokenizer is that BPE; transformers 5 saves it as
# "TokenizersBackend", so these folders name it as Phi-4 does.
_GPT2_TOKENIZER_CLASS = frozenset({"phi3", "phi3-longrope"})
# Gemma's norms hold w of the (1 + w) they scale by: centred on 0, not on 1.
_ZERO_CENTRED_NORMS = frozenset({"gemma2", "gemma3_text", "qwen3_5_text", "qwen3_next",
                                 "qwen3_5_moe_text"})
# ...except these, which scale by w: Qwen3.5's and Qwen3-Next's gated norm in their Gated
# DeltaNets.
_NORMS_CENTRED_ON_ONE = ("linear_attn.norm.weight",)
# Gemma scales its (tied) embeddings by sqrt(hidden) = 8: at the initializer's 0.2 a token's own
# embedding dominates the residual and greedy output repeats one token; at 0.1 it varies.
_EMBEDDING_STD = {"gemma2": 0.1, "gemma3_text": 0.1, "gemma4_text": 0.1,
                  # Granite multiplies its (tied) embeddings by 12: at 0.2 its greedy output
                  # echoes the input token.
                  "granitemoehybrid": 0.05}


# Gemma 4's converter reads only a sentencepiece-style BPE tokenizer (byte fallback, "▁" for a
# space: Gemma's own), so that variant carries a small one of its own (`_gemma_style_tokenizer`)
# instead of the default model's byte-level one, with Gemma's special token ids.
_GEMMA_TOKENIZER = frozenset({"gemma2", "gemma4", "gemma4-e2b"})
# Gemma 2's converter reads only sentencepiece's tokenizer.model: these folders hold one too,
# of the same pieces (`_sentencepiece_model`).
_SENTENCEPIECE_FILE = frozenset({"gemma2"})
_GEMMA_SPECIAL_TOKENS = ("<pad>", "<eos>", "<bos>", "<unk>", "<mask>", "<start_of_turn>",
                         "<end_of_turn>")
# A few merges of English letter pairs, in rank order: enough that words are not all letters.
_GEMMA_MERGES = (("▁", "t"), ("h", "e"), ("▁t", "he"), ("i", "n"), ("e", "r"), ("a", "n"),
                 ("o", "n"), ("r", "e"), ("▁", "a"), ("▁", "s"), ("e", "n"), ("▁", "w"),
                 ("o", "r"), ("a", "t"), ("▁", "c"), ("i", "t"), ("e", "s"), ("▁", "o"),
                 ("▁", "i"), ("in", "g"))
_GEMMA_CHAT_TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}<start_of_turn>"
    "{{ 'model' if m['role'] == 'assistant' else m['role'] }}\n{{ m['content'] }}<end_of_turn>\n"
    "{% endfor %}{% if add_generation_prompt %}<start_of_turn>model\n{% endif %}")


def tiny_config(variant: str, vocab_size: int) -> transformers.PretrainedConfig:
    settings = dict(_VARIANTS[variant])
    while "based_on" in settings:  # a variant of a variant of ...
        settings = _VARIANTS[settings.pop("based_on")] | settings
    model_type = settings.pop("model_type", variant)
    if settings.get("hidden_size_per_layer_input"):  # Gemma 4's per-layer embeddings
        settings.setdefault("vocab_size_per_layer_input", vocab_size)
    if "rope_theta" in settings:
        settings["rope_parameters"] = {"rope_type": "default", "rope_theta": settings.pop("rope_theta"),
                                       **settings.get("rope_parameters", {})}
    shape = {
        "hidden_size": 64,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "intermediate_size": 128,
        "max_position_embeddings": 512,
    }
    special_ids = ({"bos_token_id": 2, "eos_token_id": 1, "pad_token_id": 0}
                   if variant in _GEMMA_TOKENIZER
                   else {"bos_token_id": 1, "eos_token_id": 2, "pad_token_id": 2})
    return transformers.AutoConfig.for_model(
        model_type,
        vocab_size=vocab_size,
        rms_norm_eps=1e-5,
        # At the usual 0.02 a tied model just echoes its input token and top-2 logits nearly tie;
        # at 0.2 greedy output varies and the top-2 gap (~0.15) dwarfs float error.
        initializer_range=0.2,
        dtype="float32",
        **(special_ids | shape | settings),
    )


def save_tiny_model(
    path: Path, variant: str, tokenizer_dir: Path | None = None, seed: int = 0
) -> Path:
    """Write a tiny model of a variant (one of TINY_VARIANTS) into path (created if needed).

    The tokenizer comes from tokenizer_dir (a model folder or a .gguf file), by default the
    default model's.
    """
    tokenizer = (_gemma_style_tokenizer() if variant in _GEMMA_TOKENIZER and tokenizer_dir is None
                 else _tokenizer(tokenizer_dir))
    config = tiny_config(variant, vocab_size=len(tokenizer))
    torch.manual_seed(seed)
    model = _MODEL_CLASSES[config.model_type](config).to(torch.float32)
    if variant in _NUMPY_WEIGHTS:
        _draw_weights_with_numpy(
            model, seed, std=config.initializer_range,
            embedding_std=_EMBEDDING_STD.get(config.model_type, config.initializer_range),
            norms_centred_on=0.0 if config.model_type in _ZERO_CENTRED_NORMS else 1.0)
        _draw_layer_scalars(model, seed)
    else:
        _randomize_biases_and_norms(model, seed)
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    if variant in _LEGACY_ROPE_LAYOUT:
        _move_rope_to_legacy_layout(path / "config.json")
    if variant in _LEGACY_LAYER_TYPES:
        _name_layer_types_as_released(path / "config.json")
    if variant in _GPT2_TOKENIZER_CLASS:
        _name_tokenizer_class(path / "tokenizer_config.json", "GPT2Tokenizer")
    if variant in _SENTENCEPIECE_FILE:
        (path / "tokenizer.model").write_bytes(_sentencepiece_model())
        _list_added_tokens(path / "tokenizer_config.json", tokenizer)
    return path


@functools.cache
def _tokenizer(tokenizer_dir: Path | None) -> transformers.PreTrainedTokenizerBase:
    """Read once per session: finding the default model's tokenizer takes seconds. Only read
    and saved here, never changed."""
    return transformers.AutoTokenizer.from_pretrained(tokenizer_folder(tokenizer_dir))


@functools.cache
def _gemma_style_tokenizer(more_special: tuple[str, ...] = ()) -> transformers.PreTrainedTokenizerBase:
    """Gemma's kind of tokenizer, small: its special tokens (and more_special), a token per byte
    (the fallback), "▁" and the printable ASCII characters, then `_GEMMA_MERGES`; with a
    Gemma-like chat template."""
    special = (*_GEMMA_SPECIAL_TOKENS, *more_special)
    pieces = [*special, *(f"<0x{b:02X}>" for b in range(256)), "▁",
              *(chr(c) for c in range(33, 127)), *(a + b for a, b in _GEMMA_MERGES)]
    return transformers.GemmaTokenizer(
        vocab={piece: i for i, piece in enumerate(pieces)}, merges=list(_GEMMA_MERGES),
        extra_special_tokens=list(special[5:]), chat_template=_GEMMA_CHAT_TEMPLATE)


def gemma_style_tokenizer(more_special: tuple[str, ...] = ()) -> transformers.PreTrainedTokenizerBase:
    """The small Gemma-style tokenizer of the Gemma variants, with more special tokens (a
    multimodal model's image markers); shared: save it, never change it."""
    return _gemma_style_tokenizer(more_special)


def _sentencepiece_model() -> bytes:
    """`_gemma_style_tokenizer`'s pieces as a sentencepiece BPE model (its protobuf, written by
    hand: sentencepiece stays out of the test process): the same ids, each merge scored by its
    rank, byte fallback, no dummy prefix, as Gemma's own tokenizer.model."""
    kinds = {"<pad>": _SP_CONTROL, "<eos>": _SP_CONTROL, "<bos>": _SP_CONTROL,
             "<unk>": _SP_UNKNOWN, "<mask>": _SP_CONTROL}
    merged = {a + b: rank for rank, (a, b) in enumerate(_GEMMA_MERGES)}
    pieces = b""
    for piece in _gemma_style_tokenizer().convert_ids_to_tokens(
            range(len(_gemma_style_tokenizer()))):
        kind = kinds.get(piece, _SP_USER_DEFINED if piece in _GEMMA_SPECIAL_TOKENS else
                         _SP_BYTE if piece.startswith("<0x") else _SP_NORMAL)
        score = -float(merged.get(piece, 0))
        pieces += _proto_field(1, _proto_field(1, piece.encode()) + _proto_float(2, score)
                               + _proto_varint(3, kind))
    trainer = (_proto_varint(3, 2) + _proto_varint(4, len(_gemma_style_tokenizer()))  # BPE
               + _proto_varint(35, 1) + _proto_varint(40, 3) + _proto_varint(41, 2)
               + _proto_varint(42, 1) + _proto_varint(43, 0))
    normalizer = (_proto_field(1, b"identity") + _proto_varint(3, 0) + _proto_varint(4, 0)
                  + _proto_varint(5, 1))
    return pieces + _proto_field(2, trainer) + _proto_field(3, normalizer)


_SP_NORMAL, _SP_UNKNOWN, _SP_CONTROL, _SP_USER_DEFINED, _SP_BYTE = 1, 2, 3, 4, 6


def _varint(value: int) -> bytes:
    out = b""
    while True:
        byte, value = value & 0x7F, value >> 7
        out += bytes([byte | (0x80 if value else 0)])
        if not value:
            return out


def _proto_varint(number: int, value: int) -> bytes:
    return _varint(number << 3) + _varint(value)


def _proto_float(number: int, value: float) -> bytes:
    return _varint(number << 3 | 5) + struct.pack("<f", value)


def _proto_field(number: int, payload: bytes) -> bytes:
    return _varint(number << 3 | 2) + _varint(len(payload)) + payload


def _list_added_tokens(tokenizer_config: Path,
                       tokenizer: transformers.PreTrainedTokenizerBase) -> None:
    """The special tokens by id, as Gemma's own tokenizer_config.json lists them
    (added_tokens_decoder, which transformers 5 no longer writes): the sentencepiece converter
    reads the turn markers' kind there."""
    config = json.loads(tokenizer_config.read_text())
    config["added_tokens_decoder"] = {
        str(tokenizer.convert_tokens_to_ids(token)): {
            "content": token, "lstrip": False, "normalized": False, "rstrip": False,
            "single_word": False, "special": True}
        for token in _GEMMA_SPECIAL_TOKENS}
    tokenizer_config.write_text(json.dumps(config, indent=2))


def _name_tokenizer_class(tokenizer_config: Path, name: str) -> None:
    config = json.loads(tokenizer_config.read_text())
    config["tokenizer_class"] = name
    tokenizer_config.write_text(json.dumps(config, indent=2))


def _name_layer_types_as_released(config_file: Path) -> None:
    config = json.loads(config_file.read_text())
    released = {"linear_attention": "mamba", "full_attention": "attention"}
    config["layer_types"] = [released[kind] for kind in config["layer_types"]]
    config_file.write_text(json.dumps(config, indent=2))


def _move_rope_to_legacy_layout(config_file: Path) -> None:
    config = json.loads(config_file.read_text())
    rope = config.pop("rope_parameters")
    config["rope_theta"] = rope.pop("rope_theta")
    config["rope_scaling"] = rope
    config_file.write_text(json.dumps(config, indent=2))


@torch.no_grad()
def _draw_weights_with_numpy(model: torch.nn.Module, seed: int, std: float, embedding_std: float,
                             norms_centred_on: float) -> None:
    """Every parameter drawn from numpy's PCG64, in the order named_parameters() gives.

    The files of these models are recorded against llama.cpp by their sha256
    (tests/engine/data/llama_cpp/); torch's CPU normal sampler has vectorised paths whose last bits
    depend on the CPU, numpy's Generator is the same stream everywhere. Matrices get the
    initializer's std, norm weights a spread of 0.2 around their neutral value and biases 0.5,
    so that an engine that ignores a norm or a bias fails parity."""
    rng = np.random.Generator(np.random.PCG64(seed))
    for name, w in model.named_parameters():
        if name.endswith(_NORMS_CENTRED_ON_ONE):
            scale, centre = 0.2, 1.0
        elif "norm" in name:
            scale, centre = 0.2, norms_centred_on
        elif name.endswith(".bias"):
            scale, centre = 0.5, 0.0
        elif "embed_tokens" in name:
            scale, centre = embedding_std, 0.0
        else:
            scale, centre = std, 0.0
        values = centre + scale * rng.standard_normal(tuple(w.shape))
        w.copy_(torch.from_numpy(values.astype(np.float32)))


@torch.no_grad()
def _draw_layer_scalars(model: torch.nn.Module, seed: int) -> None:
    """Gemma 4's layer_scalar buffers (ones as transformers makes them) between 0.5 and 1.5, so
    that an engine that ignores them fails parity; from a stream of their own, after the
    parameters', so the other families' files stay as recorded."""
    scalars = [b for name, b in model.named_buffers() if name.endswith(".layer_scalar")]
    rng = np.random.Generator(np.random.PCG64(seed + 1))
    for scalar in scalars:
        scalar.copy_(torch.from_numpy(rng.uniform(0.5, 1.5, tuple(scalar.shape)).astype(np.float32)))


@torch.no_grad()
def _randomize_biases_and_norms(model: torch.nn.Module, seed: int) -> None:
    """Transformers initialises biases to 0 and norm weights to 1, which would let an engine that
    ignores them (or mixes up the q, k and v biases) pass a parity test."""
    gen = torch.Generator().manual_seed(seed)
    for name, w in model.named_parameters():
        if name.endswith(".bias"):
            w.copy_(0.5 * torch.randn(w.shape, generator=gen))
        elif "norm" in name:
            w.copy_(1 + 0.2 * torch.randn(w.shape, generator=gen))
