"""A Messages request as the chat request that asks for the same reply, and the chat request's
errors with the Messages fields' names."""

from __future__ import annotations

import re
from contextlib import AbstractContextManager

from pydantic import ValidationError

from pagoda.engine.parsers.harmony import is_harmony_template
from pagoda.engine.parsers.reasoning import reasoning_parser_for_template
from pagoda.engine.server.errors import APIError, renamed_fields, validation_error
from pagoda.engine.server.messages_input import chat_messages, system_messages
from pagoda.engine.server.messages_protocol import (
    CountTokensRequest,
    MessagesRequest,
    OutputConfig,
    ThinkingConfig,
    ToolChoice,
    ToolDefinition,
)
from pagoda.engine.server.protocol import ChatCompletionRequest, ChatMessage

# The chat request's field names in its errors, as this endpoint names them. Messages keep
# their place only where one chat message is one Messages message, so the index is dropped.
_FIELD_NAMES = (
    (re.compile(r"\bmessages\[\d+\](\.[\w\[\]\.]+)?"), "messages"),
    (re.compile(r"\btools\[(\d+)\]\.function\.parameters"), r"tools[\1].input_schema"),
    (re.compile(r"\btools\[(\d+)\]\.function\."), r"tools[\1]."),
    (re.compile(r"\btool_choice\.function\.name"), "tool_choice.name"),
    (re.compile(r"\btool_choice 'required'"), "tool_choice 'any'"),
    (re.compile(r"\bmax_(completion_)?tokens\b"), "max_tokens"),
    (re.compile(r"\bstop(?==)|^stop$"), "stop_sequences"),
    (re.compile(r"\breasoning_effort\b"), "output_config.effort"),
    (re.compile(r"\bthinking_token_budget\b"), "thinking.budget_tokens"),
)
# Anthropic's effort when none is given.
DEFAULT_EFFORT = "high"
# What a template reads to turn a model's thinking on or off (Qwen3's).
_THINKING_SWITCH = "enable_thinking"


def conversation(body: MessagesRequest | CountTokensRequest) -> list[ChatMessage]:
    """The system prompt and messages as chat messages (their errors name their blocks, so
    they are read before the chat request's errors are renamed)."""
    return [*system_messages(body.system), *chat_messages(body.messages)]


def chat_request(body: MessagesRequest | CountTokensRequest, messages: list[ChatMessage],
                 chat_template: str | None) -> ChatCompletionRequest:
    """The chat request that asks for the same reply (a token count's: the same prompt)."""
    fields = {
        "model": body.model, "messages": messages,
        "tools": _chat_tools(body.tools),
        "chat_template_kwargs": _thinking_kwargs(body.thinking, chat_template or ""),
        **_effort(body.output_config, chat_template or ""),
        **_tool_choice(body.tool_choice),
        **_prefill(messages),
    }
    if isinstance(body, MessagesRequest):
        fields |= {"max_completion_tokens": body.max_tokens, "stop": body.stop_sequences,
                   "temperature": body.temperature, "top_p": body.top_p, "top_k": body.top_k,
                   "stream": body.stream, "thinking_token_budget": _budget(body.thinking)}
    try:
        return ChatCompletionRequest.model_validate(
            {name: value for name, value in fields.items() if value is not None})
    except ValidationError as exc:
        raise validation_error(exc) from exc


def _prefill(messages: list[ChatMessage]) -> dict:
    """A conversation that ends with the assistant's words is a reply begun: the model goes on
    with it (Anthropic's prefill), as the chat endpoint's continue_final_message does."""
    last = messages[-1] if messages else None
    if last is None or last.role != "assistant":
        return {}
    if last.tool_calls:
        raise APIError(400, "messages ends with an assistant tool_use: send its tool_result in "
                            "a user message", param="messages")
    return {"continue_final_message": True, "add_generation_prompt": False}


def _chat_tools(tools: list[ToolDefinition] | None) -> list[dict] | None:
    if tools is None:
        return None
    chat_tools = []
    for i, tool in enumerate(tools):
        if tool.type not in (None, "custom"):
            raise APIError(400, f"tools[{i}].type={tool.type!r}: only client tools (name, "
                                "description, input_schema) are supported: this server runs "
                                "no built-in tools", param=f"tools[{i}].type")
        if tool.cache_control is not None:
            tool.cache_control.check(f"tools[{i}].cache_control")
        function = {"name": tool.name, "parameters": tool.input_schema}
        if tool.description is not None:
            function["description"] = tool.description
        chat_tools.append({"type": "function", "function": function})
    return chat_tools


def _tool_choice(choice: ToolChoice | None) -> dict:
    if choice is None:
        return {}
    fields: dict = {"parallel_tool_calls": not choice.disable_parallel_tool_use}
    if choice.type == "tool":
        if choice.name is None:
            raise APIError(400, "tool_choice.name is missing: a 'tool' choice names its tool",
                           param="tool_choice.name")
        return fields | {"tool_choice": {"type": "function", "function": {"name": choice.name}}}
    if choice.name is not None:
        raise APIError(400, f"tool_choice.name: only a 'tool' choice names one (this one is "
                            f"{choice.type!r})", param="tool_choice.name")
    if choice.type == "none" and choice.disable_parallel_tool_use is not None:
        raise APIError(400, "tool_choice.disable_parallel_tool_use: no tool is called under "
                            "'none'", param="tool_choice.disable_parallel_tool_use")
    return fields | {"tool_choice": {"any": "required"}.get(choice.type, choice.type)}


def _thinking_kwargs(thinking: ThinkingConfig | None, template: str) -> dict | None:
    """What the template reads to think or not; a 400 where the model cannot do as asked."""
    if thinking is None:
        return None
    reasons = is_harmony_template(template) or reasoning_parser_for_template(template) is not None
    switch = _THINKING_SWITCH in template
    if reasons and thinking.display is not None:
        raise APIError(400, "thinking.display is not supported for this model: this server "
                            "returns its thinking itself, whole (leave display out)",
                       param="thinking.display")
    if thinking.type == "adaptive" and not reasons:
        # Adaptive thinking leaves it to the model whether to think: this one cannot, so it
        # answers without (Claude Code asks so of any model it does not know).
        return None
    if thinking.type != "disabled":
        if not reasons:
            raise APIError(400, "thinking is not supported by this model: its chat template "
                                "has no reasoning (leave thinking out, adaptive or disabled)",
                           param="thinking")
        return {_THINKING_SWITCH: True} if switch else None
    if reasons and not switch:
        raise APIError(400, "thinking cannot be disabled for this model: its chat template "
                            "always reasons (leave thinking out; its reasoning comes back as "
                            "thinking blocks)", param="thinking")
    return {_THINKING_SWITCH: False} if switch else None


def _budget(thinking: ThinkingConfig | None) -> int | None:
    """Enabled thinking's budget_tokens, which the engine holds the reasoning to (a model
    that cannot think was refused enabled thinking by `_thinking_kwargs`)."""
    if thinking is None or thinking.type != "enabled":
        return None
    return thinking.budget_tokens


def _effort(config: OutputConfig | None, template: str) -> dict:
    """output_config.effort as the chat request's reasoning_effort where the template reads
    one (gpt-oss); for another model only Anthropic's default, 'high', which asks for nothing
    different (Claude Code sends it to a model it does not know)."""
    effort = None if config is None else config.effort
    if effort is None or (effort == DEFAULT_EFFORT and "reasoning_effort" not in template):
        return {}
    if "reasoning_effort" not in template:
        raise APIError(400, f"output_config.effort={effort!r} is not supported by this model: "
                            f"its chat template has no reasoning settings (leave it out or "
                            f"{DEFAULT_EFFORT!r}, the default)", param="output_config.effort")
    return {"reasoning_effort": effort}


def messages_errors() -> AbstractContextManager[None]:
    """The chat request's errors with this endpoint's field names (tools[0].input_schema...)."""
    return renamed_fields(_FIELD_NAMES)
