"""Hugging Face transformers models in fp32: the reference our engine's numbers are held to."""

import contextlib
import functools
from collections.abc import Iterator
from pathlib import Path
from unittest import mock

import gguf
import torch
import transformers

from pagoda.engine.loading.gguf import open_gguf_reader


def load_hf_model(path: Path):
    """A model folder, or a .gguf file dequantized by transformers' own GGUF reader."""
    if path.suffix == ".gguf":
        with transformers_reading_gguf_quickly():
            model = transformers.AutoModelForCausalLM.from_pretrained(
                path.parent, gguf_file=path.name, dtype=torch.float32)
    else:
        model = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    return model.eval()


@contextlib.contextmanager
def transformers_reading_gguf_quickly() -> Iterator[None]:
    """transformers' GGUF loading as it is, but its file opened by our reader, whose fields are
    gguf-py's own part for part (tests/engine/loading/test_gguf_loader.py) and not parsed item by
    item, and gguf-py's tensor-name map built once per architecture, not once per module (~400
    times for the default model): together ~2/3 of the ~20 s it took to read that file. What it
    reads and how it dequantizes stay transformers' and gguf-py's."""
    name_map = functools.lru_cache(gguf.get_tensor_name_map)
    with mock.patch.object(gguf, "GGUFReader", lambda path: open_gguf_reader(Path(path))), \
            mock.patch.object(gguf, "get_tensor_name_map", name_map):
        yield
