"""What the app and a backend hand each other: plain dataclasses, in vLLM's vocabulary."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

Role = Literal["system", "user", "assistant"]
# Why a reply ended. A failure is never a finish reason: the stream raises a BackendError.
FinishReason = Literal["stop", "length", "abort"]


@dataclass(slots=True, frozen=True)
class ChatMessage:
    role: Role
    content: str

    def as_dict(self) -> dict[str, str]:
        return {"role": self.role, "content": self.content}


@dataclass(slots=True, frozen=True)
class SamplingOptions:
    """How the reply is sampled and when it stops; what a conversation's settings ask for.

    temperature 0 is greedy. top_k 0, top_p 1, min_p 0 and the penalties' neutral values turn
    each off. top_k, min_p and repetition_penalty are vLLM's extras: a server that does not know
    them (OpenAI's own API, Ollama) samples without them.
    """

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    min_p: float = 0.0
    repetition_penalty: float = 1.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    max_tokens: int = 256
    seed: int | None = None
    stop: tuple[str, ...] = ()


@dataclass(slots=True, frozen=True)
class PromptProgress:
    """How much of the prompt the backend has read before its reply begins: `num_computed_tokens`
    of `num_prompt_tokens` (tokens found in its prefix cache count as read)."""

    num_computed_tokens: int
    num_prompt_tokens: int


@dataclass(slots=True, frozen=True)
class ReplyChunk:
    """One step of a streamed reply: the new text and all of it so far.

    The last chunk has `finish_reason` set; only it carries the counts and timings (any of which
    is None when the backend did not report it). `num_cached_tokens` is the prompt prefix the
    backend reused from earlier requests. A chunk with `prompt_progress` brings no text: the
    backend is still reading a long prompt, and says how far it is (where it can tell).
    """

    delta_text: str
    text: str
    finish_reason: FinishReason | None = None
    num_prompt_tokens: int | None = None
    num_cached_tokens: int | None = None
    num_output_tokens: int | None = None
    time_to_first_token: float | None = None
    tokens_per_s: float | None = None
    prompt_progress: PromptProgress | None = None

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None


@dataclass(slots=True, frozen=True)
class TokenCount:
    """How many tokens a chat takes as a prompt; `exact` is False for an estimate."""

    n: int
    exact: bool


@dataclass(slots=True, frozen=True)
class BackendStats:
    """What the status bar shows. None where the backend cannot tell (a remote server's KV
    cache); speeds and times are measured where they can be, at the engine or at the client."""

    num_running: int = 0
    num_waiting: int | None = None
    kv_cache_usage: float | None = None
    prefix_cache_hit_rate: float | None = None
    tokens_per_s: float = 0.0
    time_to_first_token: float | None = None
    spec_acceptance_rate: float | None = None
    # Whether drafts are verified now and why (engine.EngineStats.spec_status / spec_reason).
    spec_status: str | None = None
    spec_reason: str | None = None


def chat_cache_tag(conversation_id: int) -> str:
    """The cache tag of a chat's replies (ChatBackend.stream): one name per conversation."""
    return f"conversation-{conversation_id}"
