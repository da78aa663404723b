"""Plain data the widgets render: built by controllers from the store and the engine, never by widgets."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Literal

Role = Literal["system", "user", "assistant"]
MessageStatus = Literal["complete", "streaming", "interrupted", "error"]


@dataclass(slots=True, frozen=True)
class MessageView:
    """One message of the branch on screen, with what the transcript shows around it."""

    id: int
    role: Role
    content: str
    created_at: datetime
    status: MessageStatus = "complete"
    sibling_index: int = 0  # 0-based position among its siblings (the `< 2/3 >` switcher)
    sibling_count: int = 1
    stats_text: str = ""  # e.g. "38.2 tok/s · TTFT 0.21 s · 112 cached"
    error: str | None = None


@dataclass(slots=True, frozen=True)
class SamplingView:
    """The per-conversation settings the side panel edits."""

    system_prompt: str = ""
    temperature: float = 0.7
    top_p: float = 0.9
    top_k: int = 0
    min_p: float = 0.0
    repetition_penalty: float = 1.1
    max_tokens: int = 1024
    seed: int | None = None


@dataclass(slots=True, frozen=True)
class EngineStatusView:
    """What the status bar shows, refreshed a few times a second."""

    state: Literal["loading", "ready", "error"]
    device: str
    model: str = ""
    detail: str = ""  # loading phase or error message
    num_running: int = 0
    num_waiting: int = 0
    tokens_per_s: float = 0.0
    kv_cache_usage: float = 0.0  # 0..1
    prefix_cache_hit_rate: float = 0.0  # 0..1
    spec_acceptance_rate: float | None = None  # 0..1; None while speculative decoding is off
