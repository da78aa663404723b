"""Making the window's in-process engine, and what surrounds it: its settings, the folder its
prefix cache keeps on disk, this process's memory.

Light to import (no torch): the window reads the settings and the folder before any model
loads. `make_local_engine` imports the engine, on the host's worker thread.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from engine.config import DEFAULT_DISK_CACHE_BYTES, QUANTIZATIONS, EngineConfig
from engine.disk_cache.store import clear_folder, folder_size, forget_tag
from engine.errors import PagodaError as EngineError
from engine.folders import disk_kv_cache_dir
from engine.worker.process_memory import resident_bytes

if TYPE_CHECKING:
    from engine import AsyncEngine
    from engine.loading.loader import ProgressCallback

__all__ = ["DEFAULT_DISK_CACHE_BYTES", "QUANTIZATIONS", "EngineConfig", "EngineError",
           "EngineFactory", "clear_folder", "disk_kv_cache_dir", "folder_size", "forget_tag",
           "make_local_engine", "resident_bytes"]

EngineFactory = Callable[[str | None, EngineConfig, "ProgressCallback"], "AsyncEngine"]


def make_local_engine(model: str | None, config: EngineConfig,
                      on_progress: ProgressCallback) -> AsyncEngine:
    """The engine for `model` (None: the bundled one), built and loaded on its own thread, which
    then runs every torch operator of the model (engine/async_engine.py). Raises EngineError
    (ModelLoadError, a model too big for this machine) before anything is loaded."""
    from engine import AsyncEngine, LLMEngine
    from engine.loading.loader import load_model
    from engine.loading.model_info import check_model_fits

    check_model_fits(model, config)

    def build() -> LLMEngine:
        loaded = load_model(model, config.dtype, on_progress, quantization=config.quantization)
        return LLMEngine(config=config, loaded=loaded, release_weights=True)

    return AsyncEngine(build=build)
