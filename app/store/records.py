"""Plain data handed to callers of the store: no sessions, no ORM objects."""

from dataclasses import dataclass
from datetime import datetime
from typing import Literal

Role = Literal["system", "user", "assistant"]
Status = Literal["complete", "streaming", "interrupted", "error"]
ROLES: tuple[str, ...] = ("system", "user", "assistant")
STATUSES: tuple[str, ...] = ("complete", "streaming", "interrupted", "error")


@dataclass(slots=True, frozen=True)
class SamplingSettings:
    temperature: float = 0.7
    top_p: float = 0.9
    top_k: int = 0
    min_p: float = 0.0
    repetition_penalty: float = 1.1
    max_tokens: int = 1024
    seed: int | None = None


@dataclass(slots=True, frozen=True)
class GenerationStats:
    model: str | None = None
    ttft_s: float | None = None
    tokens_per_s: float | None = None
    cached_tokens: int | None = None


@dataclass(slots=True, frozen=True)
class Conversation:
    id: int
    title: str | None
    created_at: datetime
    updated_at: datetime
    model: str | None
    system_prompt: str | None
    sampling: SamplingSettings
    pinned: bool
    archived: bool
    deleted_at: datetime | None
    leaf_id: int | None


@dataclass(slots=True, frozen=True)
class Message:
    id: int
    conversation_id: int
    parent_id: int | None
    role: Role
    content: str
    created_at: datetime
    status: Status
    finish_reason: str | None
    prompt_tokens: int | None
    completion_tokens: int | None
    stats: GenerationStats | None
    error: str | None = None


@dataclass(slots=True, frozen=True)
class SearchHit:
    conversation_id: int
    conversation_title: str | None
    message_id: int
    role: Role
    snippet: str
    created_at: datetime


Thread = tuple[Conversation, list[Message]]
"""A conversation and all its messages, as exported and imported."""
