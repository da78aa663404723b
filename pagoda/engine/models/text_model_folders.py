"""A multimodal folder's text model, whose tensors sit under a prefix of their own beside the
image tower's: Gemma 3's (language_model.model.* as released), SmolVLM's (model.text_model.*)
and those transformers 5's modules name model.language_model.* (Gemma 3's, Qwen2.5-VL's). The
families whose folders hold one take this hook as theirs: `folder_weights` names them as a text
folder's (model.*)."""

from __future__ import annotations

import re

import torch
from transformers import PretrainedConfig

# The text model's tensors under a multimodal folder's prefix (the loader reads them for it).
FOLDER_TENSORS = re.compile(r"(?:language_model\.model|model\.(?:language_model|text_model))\.(.+)")


def folder_weights(config: PretrainedConfig,
                   tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return {"model." + FOLDER_TENSORS.fullmatch(name).group(1): tensor
            for name, tensor in tensors.items()}
