"""The bodies of POST /v1/messages and /v1/messages/count_tokens (Anthropic's Messages API) as
strict pydantic models.

Every field is honoured, or refused with a 400 naming it and saying why (`check_supported`);
docs/SERVER.md lists them. The route (pagoda/engine/server/messages.py) turns the body into a chat
request, so what the two share (sampling ranges, tools, constraints, reasoning) is checked once.
Content blocks are read one by one (pagoda/engine/server/messages_input.py), so an error names its
place (`messages[2].content[0].type`).
"""

from __future__ import annotations

from typing import ClassVar

from pydantic import Field

from pagoda.engine.server.errors import APIError
from pagoda.engine.server.protocol import (
    MAX_TOOLS,
    MAX_USER_CHARS,
    ClosedModel,
    Refusal,
    RefusingRequest,
    is_set,
)
from pagoda.engine.server.responses_protocol import MAX_INPUT_ITEMS

# How Anthropic shows thinking: a summary, or nothing (the blocks' text left empty).
THINKING_DISPLAYS = ("summarized", "omitted")
# The prefix of Anthropic's edits that clear earlier thinking (clear_thinking_20251015).
CLEAR_THINKING = "clear_thinking_"
# Anthropic's floor for a thinking budget.
MIN_THINKING_BUDGET = 1024


class InputMessage(ClosedModel):
    role: str
    content: str | list[dict]


class CacheControl(ClosedModel):
    """Anthropic's `{"type": "ephemeral"}`: cache the prompt up to here. This server's prefix
    cache keeps every prompt's blocks by their tokens, so it is honoured as it stands."""

    type: str
    ttl: str | None = None

    def check(self, path: str) -> None:
        if self.type != "ephemeral":
            raise APIError(400, f"{path}.type={self.type!r}: only 'ephemeral' is supported",
                           param=f"{path}.type")


class TextBlock(ClosedModel):
    type: str
    text: str
    cache_control: CacheControl | None = None
    citations: list | None = None


class ToolDefinition(ClosedModel):
    """A client tool; Anthropic's server tools (web search, code execution...) have a `type`
    and are refused by it (pagoda/engine/server/messages_chat.py)."""

    type: str | None = None
    name: str
    description: str | None = None
    input_schema: dict
    cache_control: CacheControl | None = None


class ToolChoice(ClosedModel):
    type: str
    name: str | None = None
    disable_parallel_tool_use: bool | None = None


class ThinkingConfig(ClosedModel):
    type: str
    budget_tokens: int | None = None
    display: str | None = None


class OutputConfig(ClosedModel):
    """`effort`: how much the model spends on its answer (messages_chat.py maps it)."""

    effort: str | None = None


class ContextManagement(ClosedModel):
    """Edits that clear parts of the context. Of them only clearing earlier thinking is
    honoured: this server leaves earlier thinking out of the prompt anyway (as chat templates
    do), so such an edit holds where the conversation has no thinking it would keep."""

    edits: list[dict] = Field(default_factory=list, max_length=8)

    def check(self, messages: list[InputMessage]) -> None:
        for i, edit in enumerate(self.edits):
            kind = edit.get("type")
            if not (isinstance(kind, str) and kind.startswith(CLEAR_THINKING)):
                raise APIError(400, f"context_management.edits[{i}].type={kind!r}: only "
                                    "clear_thinking edits (this server never compacts or "
                                    "clears tool results)",
                               param=f"context_management.edits[{i}].type")
        if self.edits and any(_holds_thinking(m) for m in messages):
            raise APIError(400, "context_management: this server leaves all earlier thinking "
                                "out of the prompt, so it cannot keep any as an edit's keep "
                                "asks (leave context_management out)",
                           param="context_management")


def _holds_thinking(message: InputMessage) -> bool:
    return isinstance(message.content, list) and any(
        block.get("type") in ("thinking", "redacted_thinking") for block in message.content)


class Metadata(ClosedModel):
    # Anthropic's opaque identifier of the end user; it changes no reply.
    user_id: str | None = Field(default=None, max_length=MAX_USER_CHARS)


# What Pagoda cannot do of the Messages API, each with why.
_MESSAGES_REFUSED: dict[str, Refusal] = {
    "service_tier": (lambda v: v not in (None, "auto", "standard_only"),
                     "it has one tier: leave service_tier out or send 'auto'"),
    "container": (is_set, "it runs no code containers: the client runs its tools"),
    "mcp_servers": (is_set, "it connects to no MCP servers: give their tools as tools and "
                            "run them in the client"),
    "inference_geo": (is_set, "it runs on this machine only"),
    "speed": (lambda v: v not in (None, "standard"), "it has one speed"),
    "diagnostics": (is_set, "it reports no prompt-cache diagnostics"),
}


class _MessagesBody(RefusingRequest):
    """What a message and its token count share: the conversation, tools and thinking."""

    _refused: ClassVar[dict[str, Refusal]] = _MESSAGES_REFUSED
    _ignored: ClassVar[frozenset[str]] = frozenset()

    model: str | None = None
    messages: list[InputMessage] = Field(max_length=MAX_INPUT_ITEMS)
    system: str | list[dict] | None = None
    tools: list[ToolDefinition] | None = Field(default=None, max_length=MAX_TOOLS)
    tool_choice: ToolChoice | None = None
    thinking: ThinkingConfig | None = None
    # Anthropic's automatic caching of the prompt's longest cached prefix.
    cache_control: CacheControl | None = None
    output_config: OutputConfig | None = None
    context_management: ContextManagement | None = None

    def check_supported(self) -> None:
        super().check_supported()
        if self.cache_control is not None:
            self.cache_control.check("cache_control")
        if self.tool_choice is not None and self.tool_choice.type not in _TOOL_CHOICES:
            raise APIError(400, f"tool_choice.type={self.tool_choice.type!r}: one of "
                                f"{', '.join(_TOOL_CHOICES)}", param="tool_choice.type")
        if self.context_management is not None:
            self.context_management.check(self.messages)
        if self.thinking is not None:
            self._check_thinking(self.thinking)
            self._check_thinking_with_tools(self.thinking, self.tool_choice)

    def _check_thinking(self, thinking: ThinkingConfig) -> None:
        if thinking.type not in ("enabled", "adaptive", "disabled"):
            raise APIError(400, f"thinking.type={thinking.type!r}: 'enabled', 'adaptive' or "
                                "'disabled' (the model thinks as its template has it, or not)",
                           param="thinking.type")
        if thinking.display not in (None, *THINKING_DISPLAYS):
            raise APIError(400, f"thinking.display={thinking.display!r}: 'summarized' or "
                                "'omitted'", param="thinking.display")
        if thinking.type == "enabled" and (thinking.budget_tokens is None
                                           or thinking.budget_tokens < MIN_THINKING_BUDGET):
            raise APIError(400, f"thinking.budget_tokens: at least {MIN_THINKING_BUDGET} with "
                                "thinking enabled", param="thinking.budget_tokens")


    @staticmethod
    def _check_thinking_with_tools(thinking: ThinkingConfig, choice: ToolChoice | None) -> None:
        """Anthropic refuses this pair, and so does this server: on every template but
        harmony's a forced call's constraint is the whole reply, with no room to think."""
        if thinking.type != "disabled" and choice is not None and choice.type in ("any",
                                                                                  "tool"):
            raise APIError(400, f"thinking cannot be {thinking.type} when tool_choice forces "
                                f"a tool ({choice.type!r}): use 'auto' or 'none', or leave "
                                "thinking out", param="thinking")


_TOOL_CHOICES = ("auto", "any", "tool", "none")


class MessagesRequest(_MessagesBody):
    """POST /v1/messages. Every field not declared here is refused in words
    (`_MESSAGES_REFUSED`) or as unrecognized: none is ignored."""

    max_tokens: int = Field(ge=1)
    stop_sequences: list[str] | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    stream: bool = False
    metadata: Metadata | None = None

    def _check_thinking(self, thinking: ThinkingConfig) -> None:
        super()._check_thinking(thinking)
        if thinking.type == "enabled" and thinking.budget_tokens >= self.max_tokens:
            raise APIError(400, f"thinking.budget_tokens={thinking.budget_tokens} must be less "
                                f"than max_tokens={self.max_tokens}: the thinking is part of "
                                "the reply", param="thinking.budget_tokens")


class CountTokensRequest(_MessagesBody):
    """POST /v1/messages/count_tokens: a message's body without what only shapes the reply."""
