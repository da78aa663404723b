"""Tiny random-weight models, built with transformers' own classes, saved as complete HF folders.

For session-scoped fixtures, e.g.
    save_tiny_model(tmp_path_factory.mktemp("qwen2"), "qwen2")
The folder holds config.json, model.safetensors, generation_config.json and the default model's
tokenizer (with its chat template), so both Pagoda and `transformers` load it as they would a
downloaded model.
"""

from __future__ import annotations

from pathlib import Path

import torch
import transformers

from engine.loader import model_folder

TINY_MODEL_TYPES = ("llama", "qwen2", "mistral")

_MODEL_CLASSES = {
    "llama": transformers.LlamaForCausalLM,
    "qwen2": transformers.Qwen2ForCausalLM,
    "mistral": transformers.MistralForCausalLM,
}
# Llama is tied like SmolLM2; qwen2 (q/k/v bias) and mistral exercise a separate lm_head.
# The rope thetas differ so that reading the wrong one shows up in parity tests.
_VARIANTS = {
    "llama": {"tie_word_embeddings": True, "rope_theta": 100000.0},
    "qwen2": {"tie_word_embeddings": False, "rope_theta": 1000000.0},
    "mistral": {"tie_word_embeddings": False, "rope_theta": 10000.0, "sliding_window": None},
}


def tiny_config(model_type: str, vocab_size: int) -> transformers.PretrainedConfig:
    variant = dict(_VARIANTS[model_type])
    theta = variant.pop("rope_theta")
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
        rope_parameters={"rope_type": "default", "rope_theta": theta},
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=2,
        dtype="float32",
        **variant,
    )


def save_tiny_model(
    path: Path, model_type: str, tokenizer_dir: Path | None = None, seed: int = 0
) -> Path:
    """Write a tiny model of model_type into path (created if needed) and return path.

    The tokenizer comes from tokenizer_dir, by default the default model's converted folder.
    """
    tokenizer = transformers.AutoTokenizer.from_pretrained(tokenizer_dir or model_folder())
    config = tiny_config(model_type, vocab_size=len(tokenizer))
    torch.manual_seed(seed)
    model = _MODEL_CLASSES[model_type](config).to(torch.float32)
    _randomize_biases_and_norms(model, seed)
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


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
