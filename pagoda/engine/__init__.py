"""Pagoda's inference engine: `from pagoda.engine import LLM, SamplingParams`.

The names below are imported on first use, not with the package: `pagoda.engine.errors`,
`pagoda.engine.config` and `pagoda.engine.loading.model_files` then import without torch, so the app can show its
window before the engine (seconds of torch and transformers) is imported."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pagoda.engine.async_engine import AsyncEngine
    from pagoda.engine.config import EngineConfig
    from pagoda.engine.errors import (
        EngineDeadError,
        InvalidTextError,
        ModelLoadError,
        PagodaError,
        PromptTooLongError,
    )
    from pagoda.engine.llm import LLM
    from pagoda.engine.llm_engine import EngineStats, LLMEngine
    from pagoda.engine.outputs import CompletionOutput, RequestMetrics, RequestOutput
    from pagoda.engine.sampling.params import PoolingParams, SamplingParams

_MODULE_OF = {
    "AsyncEngine": "pagoda.engine.async_engine",
    "EngineConfig": "pagoda.engine.config",
    "EngineDeadError": "pagoda.engine.errors",
    "InvalidTextError": "pagoda.engine.errors",
    "ModelLoadError": "pagoda.engine.errors",
    "PagodaError": "pagoda.engine.errors",
    "PromptTooLongError": "pagoda.engine.errors",
    "LLM": "pagoda.engine.llm",
    "EngineStats": "pagoda.engine.llm_engine",
    "LLMEngine": "pagoda.engine.llm_engine",
    "CompletionOutput": "pagoda.engine.outputs",
    "RequestMetrics": "pagoda.engine.outputs",
    "RequestOutput": "pagoda.engine.outputs",
    "PoolingParams": "pagoda.engine.sampling.params",
    "SamplingParams": "pagoda.engine.sampling.params",
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
        raise AttributeError(f"module 'pagoda.engine' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value
