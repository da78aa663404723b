"""What a model's Hugging Face config implies: head size, RoPE base, and every weight's shape.

The model code and the loader both read these facts; they live beside the model, which is what
they describe, so the loader depends on the model's definition and not the other way round.
"""

from __future__ import annotations

import transformers


def expected_weight_shapes(config: transformers.PretrainedConfig) -> dict[str, tuple[int, ...]]:
    """Every parameter the Llama-family model needs, by Hugging Face name, with its shape."""
    hidden = config.hidden_size
    heads = config.num_attention_heads
    kv_heads = getattr(config, "num_key_value_heads", None) or heads
    dim = head_dim(config)
    inter = config.intermediate_size
    qkv_bias, o_bias = _attention_biases(config)
    mlp_bias = bool(getattr(config, "mlp_bias", False))
    shapes: dict[str, tuple[int, ...]] = {"model.embed_tokens.weight": (config.vocab_size, hidden)}
    for i in range(config.num_hidden_layers):
        layer = f"model.layers.{i}"
        projections = {
            "self_attn.q_proj": ((heads * dim, hidden), qkv_bias),
            "self_attn.k_proj": ((kv_heads * dim, hidden), qkv_bias),
            "self_attn.v_proj": ((kv_heads * dim, hidden), qkv_bias),
            "self_attn.o_proj": ((hidden, heads * dim), o_bias),
            "mlp.gate_proj": ((inter, hidden), mlp_bias),
            "mlp.up_proj": ((inter, hidden), mlp_bias),
            "mlp.down_proj": ((hidden, inter), mlp_bias),
        }
        for module, (shape, has_bias) in projections.items():
            shapes[f"{layer}.{module}.weight"] = shape
            if has_bias:
                shapes[f"{layer}.{module}.bias"] = (shape[0],)
        if config.model_type == "qwen3":
            shapes[f"{layer}.self_attn.q_norm.weight"] = (dim,)
            shapes[f"{layer}.self_attn.k_norm.weight"] = (dim,)
        shapes[f"{layer}.input_layernorm.weight"] = (hidden,)
        shapes[f"{layer}.post_attention_layernorm.weight"] = (hidden,)
    shapes["model.norm.weight"] = (hidden,)
    if not config.tie_word_embeddings:
        shapes["lm_head.weight"] = (config.vocab_size, hidden)
    return shapes


def _attention_biases(config: transformers.PretrainedConfig) -> tuple[bool, bool]:
    """(q/k/v have a bias, o_proj has a bias), as Hugging Face's modelling code builds them."""
    if config.model_type == "qwen2":
        return True, False
    bias = bool(getattr(config, "attention_bias", False))
    return bias, bias


def head_dim(config: transformers.PretrainedConfig) -> int:
    dim = getattr(config, "head_dim", None)
    return dim if dim is not None else config.hidden_size // config.num_attention_heads


def rope_theta(config: transformers.PretrainedConfig) -> float:
    # transformers 5.x moved it into rope_parameters and leaves config.rope_theta None or absent.
    theta = getattr(config, "rope_theta", None)
    if theta is None:
        parameters = getattr(config, "rope_parameters", None) or {}
        theta = parameters.get("rope_theta")
    return float(theta) if theta is not None else 10000.0
