"""The request bodies of the OpenAI API we serve, as strict pydantic models.

Types are strict (a string is not a number); ranges are left to `SamplingParams`, whose errors
name the field. Fields other clients send that do not change the result are ignored; fields that
would (logprobs, tools, echo) are refused rather than silently dropped.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from engine.sampling_params import SamplingParams
from engine.server.errors import APIError

MAX_N = 16


class _Strict(BaseModel):
    model_config = ConfigDict(strict=True, extra="ignore")


class TextPart(_Strict):
    type: Literal["text"]
    text: str


class ChatMessage(_Strict):
    role: str
    content: str | list[TextPart] | None = None
    name: str | None = None

    def text(self) -> str:
        if isinstance(self.content, list):
            return "".join(part.text for part in self.content)
        return self.content or ""


# OpenAI's newer name for the system role; every other role is the engine's to check.
_ROLE_NAMES = {"developer": "system"}


def engine_chat(messages: list[ChatMessage]) -> list[dict[str, str]]:
    """The chat as the engine takes it; roles and contents are validated there."""
    if not messages:
        raise APIError(400, "messages is empty: give at least one message", param="messages")
    return [{"role": _ROLE_NAMES.get(m.role, m.role), "content": m.text()} for m in messages]


class StreamOptions(_Strict):
    include_usage: bool = False


class _SamplingRequest(_Strict):
    """The sampling fields both endpoints share, in OpenAI's names plus vLLM's extras."""

    model: str | None = None
    max_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    n: int = Field(default=1, ge=1, le=MAX_N)
    stop: str | list[str] | None = None
    seed: int | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    top_k: int | None = None
    min_p: float | None = None
    repetition_penalty: float | None = None
    ignore_eos: bool = False
    stream: bool = False
    stream_options: StreamOptions | None = None
    # llama.cpp's: while a long prompt is read, stream chunks with its `prompt_progress`.
    return_progress: bool = False
    logprobs: bool | int | None = None

    @property
    def include_usage(self) -> bool:
        return self.stream and self.stream_options is not None and self.stream_options.include_usage

    def sampling_params(self, max_tokens: int | None, index: int = 0) -> SamplingParams:
        """The engine's parameters for choice `index` (a seed moves on by one per choice, so n
        seeded choices differ and stay reproducible)."""
        given = {
            "temperature": self.temperature, "top_p": self.top_p, "top_k": self.top_k,
            "min_p": self.min_p, "presence_penalty": self.presence_penalty,
            "frequency_penalty": self.frequency_penalty,
            "repetition_penalty": self.repetition_penalty,
        }
        options = {name: value for name, value in given.items() if value is not None}
        seed = self.seed if self.seed is None or index == 0 else (self.seed + index) % (1 << 64)
        return SamplingParams(**options, max_tokens=max_tokens, stop=self.stop, seed=seed,
                              ignore_eos=self.ignore_eos)


class ChatCompletionRequest(_SamplingRequest):
    messages: list[ChatMessage]
    max_completion_tokens: int | None = None
    tools: list[dict] | None = None
    # vLLM's: go on with the last (assistant) message instead of starting a new reply.
    continue_final_message: bool = False
    add_generation_prompt: bool = True

    def unsupported(self) -> str | None:
        if self.logprobs:
            return "logprobs"
        if self.tools:
            return "tools"
        return None

    def resolved_max_tokens(self) -> int | None:
        return self.max_completion_tokens if self.max_completion_tokens is not None \
            else self.max_tokens


class CompletionRequest(_SamplingRequest):
    prompt: str | list[str] | list[int] | list[list[int]]
    echo: bool = False
    suffix: str | None = None
    best_of: int | None = None

    def unsupported(self) -> str | None:
        if self.logprobs is not None and self.logprobs is not False:
            return "logprobs"
        if self.echo:
            return "echo"
        if self.suffix:
            return "suffix"
        if self.best_of is not None and self.best_of != self.n:
            return "best_of"
        return None

    def resolved_max_tokens(self) -> int | None:
        return 16 if self.max_tokens is None else self.max_tokens  # OpenAI's default here

    def prompts(self) -> list[str | list[int]]:
        """One prompt, or a batch of them, as text or token ids."""
        prompt = self.prompt
        if isinstance(prompt, str):
            return [prompt]
        if prompt and all(isinstance(p, int) for p in prompt):
            return [list(prompt)]
        return list(prompt)


class TokenizeRequest(_Strict):
    """vLLM's POST /tokenize: a text prompt, or a chat in the model's template."""

    model: str | None = None
    prompt: str | None = None
    messages: list[ChatMessage] | None = None
    add_generation_prompt: bool = True
