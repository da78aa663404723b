"""A Responses request as the chat request that asks for the same reply, and the chat
request's errors with the Responses fields' names."""

from __future__ import annotations

import re
from contextlib import AbstractContextManager

from pydantic import ValidationError

from pagoda.engine.server.errors import APIError, renamed_fields, validation_error
from pagoda.engine.server.protocol import ChatCompletionRequest, ChatMessage
from pagoda.engine.server.responses_protocol import NamedFunctionChoice, ResponsesRequest

# The chat request's field names in its errors, as this endpoint names them.
_FIELD_NAMES = (
    (re.compile(r"\bmessages(\[\d+\])?(\.[\w\[\]\.]+)?"), "input"),
    (re.compile(r"\bresponse_format\.json_schema\.schema"), "text.format.schema"),
    (re.compile(r"\bresponse_format(\.\w+)?"), "text.format"),
    (re.compile(r"\btools\[(\d+)\]\.function\."), r"tools[\1]."),
    (re.compile(r"\btool_choice\.function\.name"), "tool_choice.name"),
    (re.compile(r"\breasoning_effort\b"), "reasoning.effort"),
    (re.compile(r"\bmax_(completion_)?tokens\b"), "max_output_tokens"),
)


def chat_request(body: ResponsesRequest, messages: list[ChatMessage]) -> ChatCompletionRequest:
    """The chat request that asks for the same reply."""
    fields = {
        "model": body.model, "messages": messages, "stream": body.stream,
        "max_completion_tokens": body.max_output_tokens, "temperature": body.temperature,
        "top_p": body.top_p, "parallel_tool_calls": body.parallel_tool_calls,
        "tools": _chat_tools(body.tools), "tool_choice": _chat_tool_choice(body.tool_choice),
        "response_format": _response_format(body),
        "reasoning_effort": None if body.reasoning is None else body.reasoning.effort,
    }
    try:
        return ChatCompletionRequest.model_validate(
            {name: value for name, value in fields.items() if value is not None})
    except ValidationError as exc:
        raise validation_error(exc) from exc


def _chat_tools(tools: list[dict] | None) -> list[dict] | None:
    if tools is None:
        return None
    chat_tools = []
    for i, tool in enumerate(tools):
        if tool.get("type") != "function":
            raise APIError(400, f"tools[{i}].type={tool.get('type')!r}: only 'function' tools "
                                "are supported (the client runs them; this server runs no "
                                "built-in tools)", param=f"tools[{i}].type")
        chat_tools.append({"type": "function",
                           "function": {k: v for k, v in tool.items() if k != "type"}})
    return chat_tools


def _chat_tool_choice(choice: str | NamedFunctionChoice | None) -> str | dict | None:
    if not isinstance(choice, NamedFunctionChoice):
        return choice
    if choice.type != "function" or choice.name is None:
        raise APIError(400, f"tool_choice.type={choice.type!r}: only 'auto', 'none', "
                            "'required' or {'type': 'function', 'name': ...} are supported",
                       param="tool_choice")
    return {"type": "function", "function": {"name": choice.name}}


def _response_format(body: ResponsesRequest) -> dict | None:
    form = None if body.text is None else body.text.format
    if form is None:
        return None
    if form.type != "json_schema":
        return {"type": form.type}
    schema = {"name": form.name, "description": form.description, "schema": form.json_schema,
              "strict": form.strict}
    return {"type": "json_schema",
            "json_schema": {k: v for k, v in schema.items() if v is not None}}


def responses_errors() -> AbstractContextManager[None]:
    """The chat request's errors with this endpoint's field names (input, text.format, ...)."""
    return renamed_fields(_FIELD_NAMES)
