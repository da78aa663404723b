"""What the engine knows about model files, for the window: where models go, the bundled one,
what a file is called and quantized as, and its headers read without loading it.

Everything here but `read_model_headers` and `describe_headers` is light (no torch): the window
names models before the engine is imported. Those two import the engine's model reader, so they
run on a worker thread, under ENGINE_IMPORT_LOCK the first time.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from pagoda.app.backends.services.engine_import import ENGINE_IMPORT_LOCK
from pagoda.engine.config import EngineConfig
from pagoda.engine.errors import ModelLoadError
from pagoda.engine.errors import PagodaError as EngineError
from pagoda.engine.folders import default_models_dir
from pagoda.engine.loading.model_files import (
    default_model_file,
    is_mmproj_file,
    model_name,
    quantization_of,
)

if TYPE_CHECKING:
    from pagoda.engine.loading.model_info import ModelHeaders, ModelInfo

__all__ = ["EngineError", "ModelLoadError", "bundled_model_file", "default_model_file",
           "default_models_dir", "describe_headers", "is_mmproj_file", "model_name",
           "quantization_of", "read_model_headers", "refuse_unrunnable_model"]


def read_model_headers(source: str | None) -> ModelHeaders:
    """A model's headers (the default model's for None); on a worker thread. Raises EngineError
    (a ModelLoadError) naming what is wrong with the file."""
    with ENGINE_IMPORT_LOCK:
        from pagoda.engine.loading.model_info import read_model_headers as read
    return read(source)


def refuse_unrunnable_model(source: str | None) -> None:
    """Raises ModelLoadError with the reason when the model's family or tensor types are ones
    the engine does not run, from its GGUF header or config.json alone (milliseconds, no torch)."""
    with ENGINE_IMPORT_LOCK:
        from pagoda.engine.loading.model_check import refuse_unrunnable_model as refuse
    refuse(source)


def describe_headers(headers: ModelHeaders, quantization: str, config: EngineConfig) -> ModelInfo:
    """What the model is and the memory it takes under `quantization`, computing in the dtype of
    the engine `config` would build (a multi-token-prediction block counted only where it
    speculates, as the engine builds it only then). Only after read_model_headers imported the
    reader."""
    from pagoda.engine.loading.model_info import describe_headers as describe

    if not config.num_speculative_tokens:
        headers = headers.without_mtp()
    return describe(headers, quantization, config.dtype)


def bundled_model_file() -> Path | None:
    """The bundled default model's file; None when it is not installed."""
    try:
        return default_model_file()
    except EngineError:
        return None
