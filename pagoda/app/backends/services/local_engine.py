"""Making the window's in-process engine, and what surrounds it: its settings, the folder its
prefix cache keeps on disk, this process's memory.

Light to import (no torch): the window reads the settings and the folder before any model
loads. `make_local_engine` imports the engine, on the host's worker thread.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from pagoda.engine.config import DEFAULT_DISK_CACHE_BYTES, QUANTIZATIONS, EngineConfig
from pagoda.engine.disk_cache.store import clear_folder, folder_size, forget_tag
from pagoda.engine.errors import PagodaError as EngineError
from pagoda.engine.folders import disk_kv_cache_dir
from pagoda.engine.worker.process_memory import resident_bytes

if TYPE_CHECKING:
    from collections.abc import MutableMapping

    from pagoda.engine import AsyncEngine
    from pagoda.engine.quantization.tensors import Weight

__all__ = ["DEFAULT_DISK_CACHE_BYTES", "LOAD_STEPS", "QUANTIZATIONS", "EngineConfig",
           "EngineError", "EngineFactory", "LoadProgress", "clear_folder", "disk_kv_cache_dir",
           "folder_size", "forget_tag", "make_local_engine", "resident_bytes"]

# What a load of the window's engine goes through, in order, as the user is told it. The first
# is the host's (the engine's first import: seconds of torch); the rest are make_local_engine's.
LOAD_STEPS = ("starting the engine", "checking the model", "reading the model file",
              "reading the tokenizer", "building the model", "preparing the engine")
_LOADER_STEPS = 3  # pagoda.engine.loading.loader's steps of a GGUF file, reported as LOAD_STEPS[2:5]


@dataclass(slots=True, frozen=True)
class LoadProgress:
    """Where a load stands: `LOAD_STEPS[step]`, and the share of that step done (None where
    the step has no measure)."""

    step: int
    fraction: float | None = None


LoadCallback = Callable[[LoadProgress], None]
EngineFactory = Callable[[str | None, EngineConfig, LoadCallback], "AsyncEngine"]


def make_local_engine(model: str | None, config: EngineConfig,
                      on_progress: LoadCallback) -> AsyncEngine:
    """The engine for `model` (None: the bundled one), built and loaded on its own thread, which
    then runs every torch operator of the model (pagoda/engine/async_engine.py). Raises EngineError
    (ModelLoadError, a model too big for this machine) before anything is loaded.
    `on_progress` hears each of LOAD_STEPS after the first as it begins, and how far the
    model's building is, layer by layer."""
    from pagoda.engine import AsyncEngine, LLMEngine
    from pagoda.engine.loading.loader import load_model
    from pagoda.engine.loading.model_files import mmproj_beside
    from pagoda.engine.loading.model_info import check_model_fits

    on_progress(LoadProgress(1))
    check_model_fits(model, config)
    # A GGUF's vision tower, where the setting names none: the mmproj file beside it.
    mmproj = config.mmproj or (None if model is None else mmproj_beside(Path(model)))

    def loader_step(_words: str, done: int, _total: int) -> None:
        # Its last report (all done) is the start of the model's building, told by _counted.
        if done < _LOADER_STEPS:
            on_progress(LoadProgress(2 + done))

    def build() -> LLMEngine:
        loaded = load_model(model, config.dtype, loader_step, quantization=config.quantization,
                            mmproj=mmproj, mtp=config.num_speculative_tokens > 0)
        loaded.weights = _told_as_taken(loaded.weights, on_progress)
        return LLMEngine(config=config, loaded=loaded, release_weights=True)

    return AsyncEngine(build=build)


def _told_as_taken(weights: MutableMapping[str, Weight],
             on_progress: LoadCallback) -> MutableMapping[str, Weight]:
    """`weights` handed over one by one (each leaves `weights` as the model takes it, so
    nothing is held twice), telling `on_progress` the share taken at each whole percent, and
    the last step once all are."""
    from pagoda.engine.loading.lazy_weights import LazyWeights

    total, taken, told = len(weights), 0, -1
    on_progress(LoadProgress(4, 0.0))

    def take(name: str) -> Weight:
        nonlocal taken, told
        weight = weights.pop(name)
        taken += 1
        percent = 100 * taken // total
        if taken == total:
            on_progress(LoadProgress(5))
        elif percent != told:
            told = percent
            on_progress(LoadProgress(4, taken / total))
        return weight

    return LazyWeights(list(weights), take)
