"""Whether Pagoda runs a model, from a GGUF file's header or a folder's config.json alone.

Milliseconds and no torch or transformers: a file of a family or tensor type Pagoda does not run,
or a GGUF file whose header is damaged, is refused with the reason as soon as it is picked,
before the engine is imported (seconds at a window's first load) and before its tokenizer or
weights are read. The loader checks the same facts again as it reads (pagoda/engine/loading/gguf.py,
loader.py), with these messages.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from pagoda.engine.errors import ModelLoadError
from pagoda.engine.loading.gguf_header import check_gguf_header
from pagoda.engine.loading.layouts import GGUF_FLOAT_TYPES, GGUF_INT4_TYPES, GGUF_INT8_TYPES
from pagoda.engine.models.registry import (
    MIXTURE_OF_EXPERTS,
    supported_gguf_architectures,
    supported_model_types,
    unsupported_message,
)

READABLE_GGUF_TYPES = GGUF_INT4_TYPES | GGUF_INT8_TYPES | GGUF_FLOAT_TYPES
# Gemma 4's mixture-of-experts model (26B-A4B) is a "gemma4" file or "gemma4_text" folder like
# the dense ones its family runs: its routers (GGUF) or enable_moe_block (config.json) tell it.
_GEMMA4_ROUTER = ".ffn_gate_inp."


def refuse_unrunnable_model(source: str | os.PathLike | None) -> None:
    """Raise ModelLoadError when source's header or config.json says Pagoda does not run it:
    an architecture (model_type) it does not run, with the reason, a tensor type it cannot read,
    a quantized checkpoint, a GGUF header that is damaged (MalformedGGUFError, the loader's own
    error naming the field: a cut download is refused before the engine is imported, seconds
    at a window's first load). A path that is not there or cannot be read, or a folder without
    a readable config.json, is left to the loader, whose errors name each fault."""
    if source is None:
        return  # the bundled model
    path = Path(source).expanduser()
    if path.is_dir():
        _refuse_unrunnable_folder(path)
    elif path.is_file() and path.suffix.lower() == ".gguf":
        _refuse_unrunnable_gguf(path)


def _refuse_unrunnable_gguf(path: Path) -> None:
    try:
        header = check_gguf_header(path)
    except OSError:
        return  # unreadable: the loader says why
    if header.architecture not in supported_gguf_architectures():
        raise ModelLoadError(unsupported_message(header.architecture, str(path)))
    if header.architecture == "gemma4" and any(_GEMMA4_ROUTER in t for t in header.tensor_types):
        raise ModelLoadError(_gemma4_experts_message(path))
    for name, kind in header.tensor_types.items():
        if kind.name not in READABLE_GGUF_TYPES:
            raise ModelLoadError(unreadable_type_message(name, kind.name, path))


def _gemma4_experts_message(path: Path) -> str:
    return (f"{path} is Gemma 4's mixture-of-experts model (its layers route each token to "
            f"experts): {MIXTURE_OF_EXPERTS}. Pagoda runs the dense Gemma 4 models (E2B, E4B, "
            "31B).")


def unreadable_type_message(tensor: str, type_name: str, path: Path) -> str:
    readable = ", ".join(sorted(READABLE_GGUF_TYPES))
    return (f"Tensor {tensor} in {path} is stored as {type_name}, which Pagoda cannot read. It "
            f"reads {readable}: download a Q4_K_M, Q4_0, Q5_K_M, Q6_K or Q8_0 file of the model "
            "instead.")


def _refuse_unrunnable_folder(folder: Path) -> None:
    config_file = folder / "config.json"
    try:
        raw = json.loads(config_file.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return  # no config.json, or a damaged one: the loader says which
    check_config_supported(raw, config_file)


def check_config_supported(raw: object, config_file: Path) -> None:
    """raw: config.json as parsed. Raise ModelLoadError unless it is an object whose model_type
    Pagoda runs, in float weights (no quantization_config)."""
    if not isinstance(raw, dict):
        raise ModelLoadError(
            f"{config_file} holds a JSON {type(raw).__name__}, not an object of settings. "
            "Re-download the model.")
    model_type = raw.get("model_type")
    model_type = model_type if isinstance(model_type, str) else None
    if model_type not in supported_model_types():
        raise ModelLoadError(unsupported_message(model_type, str(config_file)))
    if model_type == "gemma4_text" and raw.get("enable_moe_block"):
        raise ModelLoadError(_gemma4_experts_message(config_file))
    quantization = raw.get("quantization_config")
    if quantization:
        method = (
            quantization.get("quant_method", "unknown") if isinstance(quantization, dict) else ""
        )
        raise ModelLoadError(
            f"{config_file} describes a quantized checkpoint ({method}), which Pagoda cannot "
            "read. Use an unquantized (fp32/fp16/bf16) model folder or a .gguf file.")
