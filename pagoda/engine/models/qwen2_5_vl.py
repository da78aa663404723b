"""Qwen2.5-VL's language model: Qwen2's layers (q/k/v with biases, a SwiGLU MLP) rotated by
multimodal RoPE, whose `mrope_section` splits each head's rotated pairs among a token's time,
row and column positions (pagoda/engine/layers/rotary.py). Text tokens hold three equal
positions, so text rotates as plain RoPE, and the one-C-call decode step runs the layers; an
image's tokens lie on its grid of rows and columns (pagoda/engine/worker/mrope_positions.py).

The multimodal folders (model_type "qwen2_5_vl") hold the text model's config as text_config
(registry.TEXT_MODEL_OF), or its settings at the config's top as Qwen released them; its
weights under model. as Qwen released them and transformers 5 saves them (the text model's own
names), or model.language_model. as transformers 5's modules name them (`folder_weights`); the
vision tower under visual. or model.visual. (pagoda/engine/models/vision_tower.py).

llama.cpp's converter writes the language model as a "qwen2vl" GGUF file, its sections as
rope.dimension_sections (four counts, the fourth unused here), and the tower as an mmproj file.
"""

from __future__ import annotations

from dataclasses import replace

from transformers import PretrainedConfig, Qwen2_5_VLTextConfig

from pagoda.engine.errors import ModelLoadError
from pagoda.engine.models import llama, text_model_folders
from pagoda.engine.models.architecture import DecoderArchitecture
from pagoda.engine.models.gguf_config import GGUFSettings, llama_shape, rope_theta

NAME = "Qwen2.5-VL"  # its entry in pagoda/engine/models/registry.py names the model types it covers

# A multimodal folder's text model's tensors (pagoda/engine/models/text_model_folders.py).
FOLDER_TENSORS = text_model_folders.FOLDER_TENSORS
folder_weights = text_model_folders.folder_weights


def architecture(config: PretrainedConfig) -> DecoderArchitecture:
    if getattr(config, "use_sliding_window", False):
        raise ModelLoadError("This Qwen2.5-VL model attends within sliding windows "
                             "(use_sliding_window), as no released one does; Pagoda does not "
                             "run it.")
    return replace(llama.architecture(config), family=NAME, qkv_bias=True, o_bias=False)


def config_from_gguf(settings: GGUFSettings) -> PretrainedConfig:
    """A qwen2vl file's config from its keys: Qwen2's sizes, and the M-RoPE sections."""
    sections = settings.metadata(f"{settings.architecture}.rope.dimension_sections")
    if not isinstance(sections, list) or len(sections) < 3:
        raise ModelLoadError(f"The file states {sections!r} for rope.dimension_sections, where "
                             "Qwen2-VL's sections of rotated pairs (time, rows, columns) are "
                             "needed. The file is damaged: re-download it.")
    shape = llama_shape(settings)
    if any(sections[3:]):
        raise ModelLoadError(f"The file rotates by a fourth position (rope.dimension_sections "
                             f"{sections}), which Qwen2-VL's models do not have.")
    return Qwen2_5_VLTextConfig(
        **shape, rope_parameters={"rope_type": "default", "rope_theta": rope_theta(settings),
                                  "mrope_section": [int(n) for n in sections[:3]]})
