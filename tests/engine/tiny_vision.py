"""Tiny random multimodal models, saved as their families are released, for the vision tests:
Gemma 3 (a SigLIP tower, Gemma 3's pooled projector) with 32-pixel images of 4-pixel patches,
pooled to 4 x 4 image tokens."""

from __future__ import annotations

import json
from pathlib import Path

import torch
import transformers
from safetensors.torch import load_file, save_file

from tests.engine.tiny_models import gemma_style_tokenizer

GEMMA3_VISION = {"hidden_size": 32, "intermediate_size": 48, "num_hidden_layers": 2,
                 "num_attention_heads": 4, "image_size": 32, "patch_size": 4,
                 "layer_norm_eps": 1e-6, "vision_use_head": False}
GEMMA3_TEXT = {"hidden_size": 64, "intermediate_size": 96, "num_hidden_layers": 2,
               "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
               "sliding_window": 8}
GEMMA3_TOKENS_PER_IMAGE = 16
# Gemma 3's image markers: the start and end of an image, and the token each image embedding
# replaces.
GEMMA3_IMAGE_TOKENS = ("<start_of_image>", "<image_soft_token>", "<end_of_image>")


def gemma3_tokenizer() -> transformers.PreTrainedTokenizerBase:
    return gemma_style_tokenizer(GEMMA3_IMAGE_TOKENS)


def tiny_gemma3_vision(seed: int = 0) -> transformers.Gemma3ForConditionalGeneration:
    tokenizer = gemma3_tokenizer()
    start, image, end = tokenizer.convert_tokens_to_ids(list(GEMMA3_IMAGE_TOKENS))
    torch.manual_seed(seed)
    config = transformers.Gemma3Config(
        text_config=GEMMA3_TEXT | {"vocab_size": len(tokenizer)}, vision_config=GEMMA3_VISION,
        mm_tokens_per_image=GEMMA3_TOKENS_PER_IMAGE, image_token_index=image,
        boi_token_index=start, eoi_token_index=end)
    model = transformers.Gemma3ForConditionalGeneration(config).eval()
    with torch.no_grad():  # the projection and the norms start at zeros: draw them
        for name, parameter in model.named_parameters():
            if "multi_modal_projector" in name or "norm" in name:
                parameter.normal_(0, 0.2)
    return model


def save_gemma3_as_released(model: transformers.Gemma3ForConditionalGeneration,
                            folder: Path) -> Path:
    """The folder as Google's checkpoints lay it out (the tower under vision_tower.vision_model.,
    which llama.cpp's converter reads), with its tokenizer and the processor's settings."""
    model.save_pretrained(folder)
    gemma3_tokenizer().save_pretrained(folder)
    path = folder / "model.safetensors"
    tensors = load_file(path)
    save_file({_released(name): t for name, t in tensors.items()}, path,
              metadata={"format": "pt"})
    vision = model.config.vision_config
    (folder / "preprocessor_config.json").write_text(json.dumps({
        "image_processor_type": "Gemma3ImageProcessor",
        "image_seq_length": model.config.mm_tokens_per_image,
        "size": {"height": vision.image_size, "width": vision.image_size},
        "image_mean": [0.5] * 3, "image_std": [0.5] * 3}))
    return folder


def _released(name: str) -> str:
    prefix = "vision_tower."
    return f"{prefix}vision_model.{name[len(prefix):]}" if name.startswith(prefix) else name
