"""Pagoda's inference engine: `from engine import LLM, SamplingParams`.

The names below are imported on first use, not with the package: `engine.errors`,
`engine.config` and `engine.loading.model_files` then import without torch, so the app can show its
window before the engine (seconds of torch and transformers) is imported."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from engine.async_engine import AsyncEngine
    from engine.config import EngineConfig
    from engine.errors import (
        EngineDeadError,
        InvalidTextError,
        ModelLoadError,
        PagodaError,
        PromptTooLongError,
    )
    from engine.llm import LLM
    from engine.llm_engine import EngineStats, LLMEngine
    from engine.outputs import CompletionOutput, RequestMetrics, RequestOutput
    from engine.sampling_params import PoolingParams, SamplingParams

_MODULE_OF = {
    "AsyncEngine": "engine.async_engine",
    "EngineConfig": "engine.config",
    "EngineDeadError": "engine.errors",
    "InvalidTextError": "engine.errors",
    "ModelLoadError": "engine.errors",
    "PagodaError": "engine.errors",
    "PromptTooLongError": "engine.errors",
    "LLM": "engine.llm",
    "EngineStats": "engine.llm_engine",
    "LLMEngine": "engine.llm_engine",
    "CompletionOutput": "engine.outputs",
    "RequestMetrics": "engine.outputs",
    "RequestOutput": "engine.outputs",
    "PoolingParams": "engine.sampling_params",
    "SamplingParams": "engine.sampling_params",
}

__all__ = [
    "LLM",
    "AsyncEngine",
    "CompletionOutput",
    "EngineConfig",
    "EngineDeadError",
    "EngineStats",
    "InvalidTextError",
    "LLMEngine",
    "ModelLoadError",
    "PagodaError",
    "PoolingParams",
    "PromptTooLongError",
    "RequestMetrics",
    "RequestOutput",
    "SamplingParams",
]


def __getattr__(name: str) -> object:
    module = _MODULE_OF.get(name)
    if module is None:
        raise AttributeError(f"module 'engine' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value
