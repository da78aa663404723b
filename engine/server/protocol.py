"""The request bodies of the OpenAI API we serve, as strict pydantic models.

Types are strict (a string is not a number); ranges are left to `SamplingParams`, whose errors
name the field. Fields other clients send that do not change the result (user, metadata, store)
are ignored; fields that would (logprobs, tools, response_format, echo, an image) are refused in
words rather than silently dropped.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, ClassVar

from pydantic import BaseModel, ConfigDict, Field

from engine.sampling_params import SamplingParams
from engine.server.errors import APIError

MAX_N = 16
# The most choices one request may ask for (its prompts x n): a batch of thousands would hold the
# engine's queue, and memory, for everyone else.
MAX_CHOICES = 128


class _Strict(BaseModel):
    model_config = ConfigDict(strict=True, extra="ignore")


class ContentPart(_Strict):
    """A part of a message's content; only text parts are read (see `engine_chat`)."""

    type: str
    text: str | None = None


class ChatMessage(_Strict):
    role: str
    content: str | list[ContentPart] | None = None
    name: str | None = None

    def text(self, index: int) -> str:
        if isinstance(self.content, list):
            return "".join(_part_text(part, f"messages[{index}].content[{j}]")
                           for j, part in enumerate(self.content))
        return self.content or ""


def _part_text(part: ContentPart, path: str) -> str:
    if part.type != "text":
        raise APIError(400, f"{path} is an {part.type!r} part: this model takes text only; "
                            "send the message as text", param=path)
    if part.text is None:
        raise APIError(400, f"{path}.text is missing: a text part needs its text",
                       param=f"{path}.text")
    return part.text


# OpenAI's newer name for the system role; every other role is the engine's to check.
_ROLE_NAMES = {"developer": "system"}


def engine_chat(messages: list[ChatMessage]) -> list[dict[str, str]]:
    """The chat as the engine takes it; roles and contents are validated there."""
    if not messages:
        raise APIError(400, "messages is empty: give at least one message", param="messages")
    return [{"role": _ROLE_NAMES.get(m.role, m.role), "content": m.text(i)}
            for i, m in enumerate(messages)]


def check_choices(num_prompts: int, n: int) -> None:
    """Refuse a request for more than MAX_CHOICES choices before anything is built for them."""
    if num_prompts * n > MAX_CHOICES:
        raise APIError(400, f"this request asks for {num_prompts * n} choices ({num_prompts} "
                            f"prompts x n={n}); this server makes at most {MAX_CHOICES} per "
                            "request: send fewer prompts per request or lower n",
                       param="prompt" if num_prompts > 1 else "n", code="too_many_choices")


def _is_set(value: Any) -> bool:
    return value is not None


def _given(value: Any) -> bool:
    """Anything but null or false (`"logprobs": false` asks for nothing)."""
    return value is not None and value is not False


def _asks(value: Any) -> bool:
    """Anything but null, false or empty (`"logit_bias": {}`, `"tools": []`)."""
    return _given(value) and value not in ({}, [], "")


# A field we do not honour: refused when its value would change the result, with why.
Refusal = tuple[Callable[[Any], bool], str]
_NO_LOGPROBS = "it returns no token probabilities"
_NO_TOOLS = "it does not call tools"
_NO_FORMATS = "it does not constrain replies to a format or grammar"
_REFUSED: dict[str, Refusal] = {
    "logit_bias": (_asks, "it does not bias tokens"),
    **{name: (_is_set, _NO_FORMATS) for name in (
        "guided_json", "guided_regex", "guided_choice", "guided_grammar", "structured_outputs")},
}
_CHAT_REFUSED: dict[str, Refusal] = {
    **_REFUSED,
    "logprobs": (_given, _NO_LOGPROBS),
    # OpenAI refuses top_logprobs without logprobs; as we return none, any value is refused.
    "top_logprobs": (_is_set, f"{_NO_LOGPROBS} (and top_logprobs needs logprobs=true)"),
    "tools": (_asks, _NO_TOOLS),
    "functions": (_asks, _NO_TOOLS),
    # Even "none": OpenAI refuses tool_choice without tools, and this server takes no tools.
    "tool_choice": (_is_set, f"{_NO_TOOLS} (and tool_choice needs tools)"),
    "function_call": (_is_set, f"{_NO_TOOLS} (and function_call needs functions)"),
    "response_format": (lambda v: v is not None and v != {"type": "text"},
                        f'{_NO_FORMATS}; only {{"type": "text"}} is taken'),
    "modalities": (lambda v: v is not None and v != ["text"], "this model answers in text only"),
    "audio": (_is_set, "this model answers in text only"),
    "reasoning_effort": (_is_set, "it has no reasoning settings"),
}
_COMPLETION_REFUSED: dict[str, Refusal] = {
    **_REFUSED,
    "logprobs": (_given, _NO_LOGPROBS),
    "echo": (_given, "it does not echo the prompt"),
    "suffix": (_asks, "it does not complete text before a suffix"),
}


class _Refusing(_Strict):
    """A request body that keeps the fields it does not declare, to refuse those it cannot
    honour (`check_supported`)."""

    model_config = ConfigDict(strict=True, extra="allow")
    _refused: ClassVar[dict[str, Refusal]] = _REFUSED

    def check_supported(self) -> None:
        for name, value in (self.model_extra or {}).items():
            refusal = self._refused.get(name)
            if refusal is not None and refusal[0](value):
                raise APIError(400, f"{name} is not supported by this server: {refusal[1]}",
                               param=name)


class StreamOptions(_Strict):
    include_usage: bool = False


class _SamplingRequest(_Refusing):
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
    # vLLM's: go on with the last (assistant) message instead of starting a new reply.
    continue_final_message: bool = False
    add_generation_prompt: bool = True

    _refused: ClassVar[dict[str, Refusal]] = _CHAT_REFUSED

    def resolved_max_tokens(self) -> int | None:
        return self.max_completion_tokens if self.max_completion_tokens is not None \
            else self.max_tokens


class CompletionRequest(_SamplingRequest):
    prompt: str | list[str] | list[int] | list[list[int]]
    best_of: int | None = None

    _refused: ClassVar[dict[str, Refusal]] = _COMPLETION_REFUSED

    def check_supported(self) -> None:
        super().check_supported()
        if self.best_of is not None and self.best_of != self.n:
            raise APIError(400, "best_of is not supported by this server: it returns every "
                                "choice it makes (best_of must equal n)", param="best_of")

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
