"""Hugging Face transformers models in fp32: the reference our engine's numbers are held to."""

from pathlib import Path

import torch
import transformers


def load_hf_model(path: Path):
    """A model folder, or a .gguf file dequantized by transformers' own GGUF reader."""
    if path.suffix == ".gguf":
        model = transformers.AutoModelForCausalLM.from_pretrained(
            path.parent, gguf_file=path.name, dtype=torch.float32)
    else:
        model = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    return model.eval()
