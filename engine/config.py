"""Engine settings, with defaults chosen for a laptop CPU."""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch


@dataclass(slots=True, frozen=True)
class SchedulerConfig:
    max_num_seqs: int
    max_num_batched_tokens: int
    max_model_len: int


@dataclass(slots=True)
class EngineConfig:
    """What `LLM(...)` and `AsyncEngine(...)` accept besides the model.

    kv_cache_memory: bytes for the KV pool; num_kv_blocks overrides it when given.
    max_num_batched_tokens: the per-step token budget shared by decodes and prefill chunks.
    """

    block_size: int = 16
    kv_cache_memory: int = 1 << 30
    num_kv_blocks: int | None = None
    max_num_seqs: int = 64
    max_num_batched_tokens: int = 512
    max_model_len: int | None = None
    enable_prefix_caching: bool = True
    dtype: torch.dtype = torch.float32
    device: str = "cpu"
    num_threads: int | None = None

    def __post_init__(self) -> None:
        for name in ("block_size", "kv_cache_memory", "max_num_seqs", "max_num_batched_tokens"):
            if getattr(self, name) < 1:
                raise ValueError(f"EngineConfig.{name}={getattr(self, name)!r} must be >= 1")
        if self.num_kv_blocks is not None and self.num_kv_blocks < 1:
            raise ValueError(f"EngineConfig.num_kv_blocks={self.num_kv_blocks!r} must be >= 1")
        if self.max_model_len is not None and self.max_model_len < 2:
            raise ValueError(f"EngineConfig.max_model_len={self.max_model_len!r} must be >= 2")

    def resolved_num_threads(self) -> int:
        return self.num_threads or len(os.sched_getaffinity(0))
