"""Tiny random-weight models, built with transformers' own classes, saved as complete HF folders.

For session-scoped fixtures, e.g.
    save_tiny_model(tmp_path_factory.mktemp("qwen2"), "qwen2")
The folder holds config.json, model.safetensors, generation_config.json and the default model's
tokenizer (with its chat template), so both Pagoda and `transformers` load it as they would a
downloaded model.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
import transformers

from engine.loading.loader import tokenizer_folder

TINY_MODEL_TYPES = ("llama", "qwen2", "mistral", "qwen3")
# Further variants of those types, by name: save_tiny_model(path, "qwen3-tied").
TINY_VARIANTS = (*TINY_MODEL_TYPES, "qwen3-tied", "llama3-rope")

_MODEL_CLASSES = {
    "llama": transformers.LlamaForCausalLM,
    "qwen2": transformers.Qwen2ForCausalLM,
    "mistral": transformers.MistralForCausalLM,
    "qwen3": transformers.Qwen3ForCausalLM,
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
}
# Released checkpoints of these variants keep rope_theta and rope_scaling at the top level of
# config.json (transformers 4.x's layout); the saved folder is rewritten that way.
_LEGACY_ROPE_LAYOUT = frozenset({"llama3-rope"})


def tiny_config(variant: str, vocab_size: int) -> transformers.PretrainedConfig:
    settings = dict(_VARIANTS[variant])
    model_type = settings.pop("model_type", variant)
    rope = {"rope_type": "default", "rope_theta": settings.pop("rope_theta"),
            **settings.pop("rope_parameters", {})}
    return transformers.AutoConfig.for_model(
        model_type,
        vocab_size=vocab_size,
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        intermediate_size=128,
        max_position_embeddings=512,
        rms_norm_eps=1e-5,
        # At the usual 0.02 a tied model just echoes its input token and top-2 logits nearly tie;
        # at 0.2 greedy output varies and the top-2 gap (~0.15) dwarfs float error.
        initializer_range=0.2,
        rope_parameters=rope,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=2,
        dtype="float32",
        **settings,
    )


def save_tiny_model(
    path: Path, variant: str, tokenizer_dir: Path | None = None, seed: int = 0
) -> Path:
    """Write a tiny model of a variant (one of TINY_VARIANTS) into path (created if needed).

    The tokenizer comes from tokenizer_dir (a model folder or a .gguf file), by default the
    default model's.
    """
    tokenizer = transformers.AutoTokenizer.from_pretrained(tokenizer_folder(tokenizer_dir))
    config = tiny_config(variant, vocab_size=len(tokenizer))
    torch.manual_seed(seed)
    model = _MODEL_CLASSES[config.model_type](config).to(torch.float32)
    _randomize_biases_and_norms(model, seed)
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    if variant in _LEGACY_ROPE_LAYOUT:
        _move_rope_to_legacy_layout(path / "config.json")
    return path


def _move_rope_to_legacy_layout(config_file: Path) -> None:
    config = json.loads(config_file.read_text())
    rope = config.pop("rope_parameters")
    config["rope_theta"] = rope.pop("rope_theta")
    config["rope_scaling"] = rope
    config_file.write_text(json.dumps(config, indent=2))


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
