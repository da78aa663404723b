"""The body of POST /v1/responses (OpenAI's Responses API) as strict pydantic models.

Every field is honoured, or refused with a 400 naming it and saying why (`check_supported`);
docs/SERVER.md lists them. The route (pagoda/engine/server/responses.py) turns the body into a chat
request, so what the two share (sampling ranges, tools, constraints, reasoning) is checked once.
"""

from __future__ import annotations

from typing import Any, ClassVar

from pydantic import ConfigDict, Field

from pagoda.engine.server.errors import APIError
from pagoda.engine.server.protocol import (
    MAX_TOOLS,
    MAX_USER_CHARS,
    ClosedModel,
    Refusal,
    RefusingRequest,
    StrictModel,
    asks_for,
    is_given,
    is_set,
)

# The items of one request's `input`: a conversation, not a corpus (the body limit bounds
# their size).
MAX_INPUT_ITEMS = 2048
# OpenAI's limits on `metadata`: 16 pairs, keys of 64 and values of 512 characters.
MAX_METADATA_PAIRS = 16
MAX_METADATA_KEY = 64
MAX_METADATA_VALUE = 512
# Codex CLI's `client_metadata` (its turn's ids, one value a JSON object of ~750 characters).
MAX_CLIENT_METADATA_VALUE = 4096
# The one `include` answered. Codex CLI asks for it (with store false) so that it can send its
# reasoning items back itself; ours carry the reasoning's own text, and earlier reasoning is
# left out of the prompt, so no encrypted copy is needed: the items come back as they are.
INCLUDE_ANSWERED = frozenset({"reasoning.encrypted_content"})


class ContentPart(StrictModel):
    # Other fields are kept so that a part of another type (an image's `image_url`) is refused
    # by its type, and a text part's unknown field by its name (pagoda/engine/server/responses.py).
    model_config = ConfigDict(strict=True, extra="allow")

    """A part of a message's content: `input_text`, or `output_text` as a client sends our own
    output back (its `annotations` and `logprobs` are ours, read back and left out of the
    prompt, as the chat endpoint's history keeps only text), or a reasoning item's
    `reasoning_text`."""

    type: str
    text: str | None = None
    annotations: list | None = None
    logprobs: list | None = None


class InputItem(ClosedModel):
    """One item of `input`: a message (`type` "message" or absent), a `function_call` the model
    made, its `function_call_output`, or a `reasoning` item of ours sent back. Which fields an
    item may have is checked by its type (pagoda/engine/server/responses.py)."""

    type: str = "message"
    id: str | None = None
    status: str | None = None
    # A message.
    role: str | None = None
    content: str | list[ContentPart] | None = None
    phase: str | None = None
    # A function call, and its output.
    call_id: str | None = None
    name: str | None = None
    arguments: str | None = None
    output: str | list[ContentPart] | None = None
    # A reasoning item.
    summary: list | None = None
    encrypted_content: str | None = None


class TextFormat(ClosedModel):
    """`text.format`: plain text, any JSON object, or JSON following a schema (OpenAI's
    flat form of the chat endpoint's response_format)."""

    model_config = ConfigDict(strict=True, extra="forbid", populate_by_name=True)
    type: str
    name: str | None = None
    description: str | None = None
    json_schema: dict | None = Field(default=None, alias="schema")
    strict: bool | None = None


class TextConfig(ClosedModel):
    format: TextFormat | None = None


class Reasoning(ClosedModel):
    effort: str | None = None
    # OpenAI's models write a summary of their reasoning; ours return the reasoning itself, so
    # only "auto" (the server's choice) is honoured.
    summary: str | None = None
    generate_summary: str | None = None


class NamedFunctionChoice(ClosedModel):
    type: str
    name: str | None = None


def _only_answered(include: Any) -> bool:
    return isinstance(include, list) and all(
        isinstance(value, str) and value in INCLUDE_ANSWERED for value in include)


# What Pagoda cannot do of the Responses API, each with why.
_RESPONSES_REFUSED: dict[str, Refusal] = {
    "include": (lambda v: asks_for(v) and not _only_answered(v),
                "it returns no extra output data (no logprobs, no tool results): leave include "
                "out ('reasoning.encrypted_content' is answered: reasoning items hold their "
                "text, which this server never needs back)"),
    "background": (is_given, "it runs every response while the request waits: leave background "
                           "out and keep the connection open (or stream)"),
    "conversation": (is_set, "it keeps no conversations: chain responses with "
                              "previous_response_id"),
    "prompt": (is_set, "it keeps no saved prompts: send the prompt's text as instructions"),
    "truncation": (lambda v: v not in (None, "disabled"),
                   "it never drops input to fit the context: a prompt longer than the context "
                   "is a 400 (truncation 'disabled')"),
    "service_tier": (lambda v: v not in (None, "auto", "default"),
                     "it has one tier: leave service_tier out or send 'auto'"),
    "top_logprobs": (is_set, "it returns no logprobs here: use /v1/chat/completions with "
                              "logprobs"),
    "max_tool_calls": (is_set, "it runs no built-in tools: the client runs the function "
                                "tools"),
    "stream_options": (is_set, "it sends the events as they are (no obfuscation)"),
    "prompt_cache_retention": (is_set, "its prefix cache keeps what memory allows, for no "
                                        "set time"),
    "context_management": (is_set, "it never compacts the context"),
}


class ResponsesRequest(RefusingRequest):
    """POST /v1/responses. Every field not declared here is refused in words
    (`_RESPONSES_REFUSED`) or as unrecognized: none is ignored."""

    _refused: ClassVar[dict[str, Refusal]] = _RESPONSES_REFUSED
    _ignored: ClassVar[frozenset[str]] = frozenset()

    model: str | None = None
    # Items are read one by one (pagoda/engine/server/responses.py), so an error names its index.
    input: str | list[dict] | None = Field(default=None, max_length=MAX_INPUT_ITEMS)
    instructions: str | None = None
    tools: list[dict] | None = Field(default=None, max_length=MAX_TOOLS)
    tool_choice: str | NamedFunctionChoice | None = None
    parallel_tool_calls: bool = True
    text: TextConfig | None = None
    reasoning: Reasoning | None = None
    max_output_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    stream: bool = False
    store: bool = True
    previous_response_id: str | None = Field(default=None, max_length=MAX_USER_CHARS)
    metadata: dict[str, str] | None = None
    user: str | None = Field(default=None, max_length=MAX_USER_CHARS)
    safety_identifier: str | None = Field(default=None, max_length=MAX_USER_CHARS)
    # OpenAI's key to route repeats to one cache; ours finds a repeated prefix by its tokens.
    prompt_cache_key: str | None = Field(default=None, max_length=MAX_USER_CHARS)
    # Codex CLI's labels of its turn (session, thread and turn ids): they change no reply.
    client_metadata: dict[str, str] | None = None

    def check_supported(self) -> None:
        super().check_supported()
        _check_metadata(self.metadata)
        _check_metadata(self.client_metadata, "client_metadata", MAX_CLIENT_METADATA_VALUE)
        if self.reasoning is not None:
            _check_reasoning(self.reasoning)

    def echo(self) -> dict[str, Any]:
        """The request's settings as the response object repeats them."""
        return {
            "instructions": self.instructions, "metadata": self.metadata or {},
            "max_output_tokens": self.max_output_tokens,
            "parallel_tool_calls": self.parallel_tool_calls,
            "previous_response_id": self.previous_response_id,
            "temperature": self.temperature, "top_p": self.top_p,
            "tools": self.tools or [], "tool_choice": _choice_echo(self.tool_choice),
            "text": self.text.model_dump(by_alias=True, exclude_none=True) if self.text
            else {"format": {"type": "text"}},
            "reasoning": self.reasoning.model_dump() if self.reasoning else None,
            "store": self.store, "user": self.user, "truncation": "disabled",
            "service_tier": "default",
        }


def _choice_echo(choice: str | NamedFunctionChoice | None) -> Any:
    if isinstance(choice, NamedFunctionChoice):
        return choice.model_dump(exclude_none=True)
    return choice or "auto"


def _check_metadata(metadata: dict[str, str] | None, field: str = "metadata",
                    max_value: int = MAX_METADATA_VALUE) -> None:
    if metadata is None:
        return
    if len(metadata) > MAX_METADATA_PAIRS:
        raise APIError(400, f"{field} has {len(metadata)} pairs: at most "
                            f"{MAX_METADATA_PAIRS}", param=field)
    for key, value in metadata.items():
        if len(key) > MAX_METADATA_KEY or len(value) > max_value:
            raise APIError(400, f"{field}[{key[:MAX_METADATA_KEY]!r}]: keys are at most "
                                f"{MAX_METADATA_KEY} characters and values at most "
                                f"{max_value}", param=field)


def _check_reasoning(reasoning: Reasoning) -> None:
    for field in ("summary", "generate_summary"):
        value = getattr(reasoning, field)
        if value not in (None, "auto"):
            raise APIError(400, f"reasoning.{field}={value!r} is not supported by this server: "
                                "it returns the model's reasoning itself as a reasoning item, "
                                "not a summary ('auto' or leave it out)",
                           param=f"reasoning.{field}")

