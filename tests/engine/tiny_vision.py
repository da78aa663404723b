"""Tiny random multimodal models, saved as their families are released, for the vision tests:
Gemma 3 (a SigLIP tower, Gemma 3's pooled projector) with 32-pixel images of 4-pixel patches,
pooled to 4 x 4 image tokens."""

from __future__ import annotations

import copy
import functools
import json
from pathlib import Path

import torch
import transformers
from safetensors.torch import load_file, save_file

from pagoda.engine.loading.loader import tokenizer_folder

GEMMA3_VISION = {"hidden_size": 32, "intermediate_size": 48, "num_hidden_layers": 2,
                 "num_attention_heads": 4, "image_size": 32, "patch_size": 4,
                 "layer_norm_eps": 1e-6, "vision_use_head": False}
GEMMA3_TEXT = {"hidden_size": 64, "intermediate_size": 96, "num_hidden_layers": 2,
               "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
               "sliding_window": 8,
               # = head_dim, as in every released Gemma 3: llama.cpp scales by head_dim
               "query_pre_attn_scalar": 16}
GEMMA3_TOKENS_PER_IMAGE = 16
# Gemma 3's image markers: the start and end of an image, and the token each image embedding
# replaces.
GEMMA3_IMAGE_TOKENS = ("<start_of_image>", "<image_soft_token>", "<end_of_image>")


@functools.cache
def _gemma3_tokenizer() -> transformers.PreTrainedTokenizerBase:
    tokenizer = transformers.AutoTokenizer.from_pretrained(tokenizer_folder())
    tokenizer.add_special_tokens({"additional_special_tokens": list(GEMMA3_IMAGE_TOKENS)})
    return tokenizer


def gemma3_tokenizer() -> transformers.PreTrainedTokenizerBase:
    """The default model's tokenizer (which llama.cpp's converter knows) with Gemma 3's image
    tokens added; a copy each call."""
    return copy.deepcopy(_gemma3_tokenizer())


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


# SmolVLM: a SigLIP tower of 32-pixel tiles in 4-pixel patches (8 x 8), pixel-shuffled by 2 to
# 16 tokens a tile; a Llama-shaped text model. Its processor resizes an image's longest edge to
# 64 pixels and splits it into tiles of 32 (at most 2 x 2, and the whole image as a last tile).
SMOLVLM_VISION = {"hidden_size": 32, "intermediate_size": 48, "num_hidden_layers": 2,
                  "num_attention_heads": 4, "image_size": 32, "patch_size": 4,
                  "layer_norm_eps": 1e-6}
SMOLVLM_TEXT = {"model_type": "llama", "hidden_size": 64, "intermediate_size": 96,
                "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
                "head_dim": 16, "max_position_embeddings": 2048, "rms_norm_eps": 1e-5,
                "tie_word_embeddings": False, "architectures": ["LlamaForCausalLM"]}
SMOLVLM_TOKENS_PER_TILE = 16
SMOLVLM_LONGEST_EDGE = 64
# SmolVLM's image tokens: around an image's tiles, the whole image's tag, the placeholder, and
# each tile's place in the grid.
SMOLVLM_IMAGE_TOKENS = ("<fake_token_around_image>", "<global-img>", "<image>",
                        *(f"<row_{r}_col_{c}>" for r in range(1, 7) for c in range(1, 7)))


@functools.cache
def _smolvlm_tokenizer() -> transformers.PreTrainedTokenizerBase:
    tokenizer = transformers.AutoTokenizer.from_pretrained(tokenizer_folder())
    tokenizer.add_special_tokens({"additional_special_tokens": list(SMOLVLM_IMAGE_TOKENS)})
    return tokenizer


def smolvlm_tokenizer() -> transformers.PreTrainedTokenizerBase:
    """The default model's tokenizer with SmolVLM's image tokens added; a copy each call."""
    return copy.deepcopy(_smolvlm_tokenizer())


def tiny_smolvlm(seed: int = 0, idefics3: bool = False
                 ) -> transformers.SmolVLMForConditionalGeneration:
    """idefics3: the first SmolVLMs' classes (Idefics3ForConditionalGeneration), the same
    model under another name."""
    tokenizer = smolvlm_tokenizer()
    torch.manual_seed(seed)
    config_class, model_class = (
        (transformers.Idefics3Config, transformers.Idefics3ForConditionalGeneration) if idefics3
        else (transformers.SmolVLMConfig, transformers.SmolVLMForConditionalGeneration))
    config = config_class(
        text_config=SMOLVLM_TEXT | {"vocab_size": len(tokenizer)},
        vision_config=SMOLVLM_VISION, scale_factor=2,
        image_token_id=tokenizer.convert_tokens_to_ids("<image>"))
    model = model_class(config).eval()
    with torch.no_grad():  # the norms start at ones and zeros: draw them
        for name, parameter in model.named_parameters():
            if "norm" in name:
                parameter.normal_(1.0 if name.endswith("weight") else 0.0, 0.2)
    return model


def save_smolvlm(model: transformers.SmolVLMForConditionalGeneration, folder: Path,
                 longest_edge: int = SMOLVLM_LONGEST_EDGE, splitting: bool = True) -> Path:
    """The folder as HuggingFaceTB's checkpoints lay it out, with its tokenizer and the
    processor's settings (longest_edge: what an image's longest edge is resized to before it is
    split into tiles)."""
    model.save_pretrained(folder)
    smolvlm_tokenizer().save_pretrained(folder)
    tile = model.config.vision_config.image_size
    (folder / "preprocessor_config.json").write_text(json.dumps({
        "image_processor_type": "SmolVLMImageProcessor", "do_image_splitting": splitting,
        "size": {"longest_edge": longest_edge}, "max_image_size": {"longest_edge": tile},
        "resample": 1, "image_mean": [0.5] * 3, "image_std": [0.5] * 3}))
    return folder


# Qwen2.5-VL: a tower of 14-pixel patches (two frames each: a still image is repeated), merged
# 2 x 2 into one image token, attending within 112-pixel windows but in its full-attention layers
# (every second, as llama.cpp's converter requires a period); its text model rotates each head's
# 16 dimensions in sections of 2, 3 and 3 pairs over (time, row, column) positions.
QWEN2_5_VL_VISION = {"depth": 4, "hidden_size": 32, "intermediate_size": 48, "num_heads": 4,
                     "patch_size": 14, "spatial_merge_size": 2, "temporal_patch_size": 2,
                     "window_size": 112, "fullatt_block_indexes": [1, 3], "out_hidden_size": 64,
                     "hidden_act": "silu"}
QWEN2_5_VL_TEXT = {"hidden_size": 64, "intermediate_size": 96, "num_hidden_layers": 2,
                   "num_attention_heads": 4, "num_key_value_heads": 2, "rms_norm_eps": 1e-6,
                   "rope_parameters": {"rope_type": "default", "rope_theta": 1e6,
                                       "mrope_section": [2, 3, 3]}}
# Qwen2.5-VL's image and video tokens: an image's start, each of its placeholders, its end (a
# video's placeholder, which no test sends, has its own).
QWEN2_5_VL_IMAGE_TOKENS = ("<|vision_start|>", "<|image_pad|>", "<|vision_end|>")
QWEN2_5_VL_VIDEO_TOKEN = "<|video_pad|>"
# The processor's bounds, in pixels (those of the released preprocessor_config.json, scaled down).
QWEN2_5_VL_MIN_PIXELS = 56 * 56
QWEN2_5_VL_MAX_PIXELS = 28 * 28 * 128


@functools.cache
def _qwen2_5_vl_tokenizer() -> transformers.PreTrainedTokenizerBase:
    tokenizer = transformers.AutoTokenizer.from_pretrained(tokenizer_folder())
    tokenizer.add_special_tokens({"additional_special_tokens": [*QWEN2_5_VL_IMAGE_TOKENS,
                                                                QWEN2_5_VL_VIDEO_TOKEN]})
    return tokenizer


def qwen2_5_vl_tokenizer() -> transformers.PreTrainedTokenizerBase:
    """The default model's tokenizer with Qwen2.5-VL's vision tokens added; a copy each call."""
    return copy.deepcopy(_qwen2_5_vl_tokenizer())


def tiny_qwen2_5_vl(seed: int = 0) -> transformers.Qwen2_5_VLForConditionalGeneration:
    tokenizer = qwen2_5_vl_tokenizer()
    start, image, end, video = tokenizer.convert_tokens_to_ids(
        [*QWEN2_5_VL_IMAGE_TOKENS, QWEN2_5_VL_VIDEO_TOKEN])
    torch.manual_seed(seed)
    config = transformers.Qwen2_5_VLConfig(
        text_config=QWEN2_5_VL_TEXT | {"vocab_size": len(tokenizer),
                                       "bos_token_id": tokenizer.bos_token_id,
                                       "eos_token_id": tokenizer.eos_token_id},
        vision_config=QWEN2_5_VL_VISION, image_token_id=image, video_token_id=video,
        vision_start_token_id=start, vision_end_token_id=end)
    model = transformers.Qwen2_5_VLForConditionalGeneration(config).eval()
    with torch.no_grad():  # the norms start at ones and the biases at zeros: draw them
        for name, parameter in model.named_parameters():
            if "norm" in name or "ln_q" in name or name.endswith("bias"):
                parameter.normal_(0, 0.2).add_(1.0 if parameter.ndim == 1 and "bias" not in name
                                               else 0.0)
    return model


def save_qwen2_5_vl(model: transformers.Qwen2_5_VLForConditionalGeneration,
                    folder: Path) -> Path:
    """The folder as Qwen released it, which is how transformers 5 saves it too (the text model
    under model.*, the tower under visual.*), with its tokenizer and the processor's
    settings."""
    model.save_pretrained(folder)
    qwen2_5_vl_tokenizer().save_pretrained(folder)
    vision = model.config.vision_config
    (folder / "preprocessor_config.json").write_text(json.dumps({
        "image_processor_type": "Qwen2VLImageProcessor", "patch_size": vision.patch_size,
        "temporal_patch_size": vision.temporal_patch_size,
        "merge_size": vision.spatial_merge_size, "min_pixels": QWEN2_5_VL_MIN_PIXELS,
        "max_pixels": QWEN2_5_VL_MAX_PIXELS,
        "image_mean": [0.48145466, 0.4578275, 0.40821073],
        "image_std": [0.26862954, 0.26130258, 0.27577711]}))
    return folder
