"""Pagoda's inference engine: `from engine import LLM, SamplingParams`."""

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
from engine.sampling_params import SamplingParams

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
    "PromptTooLongError",
    "RequestMetrics",
    "RequestOutput",
    "SamplingParams",
]
