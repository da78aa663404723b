"""A chat's streamed request to an OpenAI-compatible server, with our sampling in its words."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

from pagoda.app.backends.errors import InvalidRequestError
from pagoda.app.backends.chat.tool_options import named_function
from pagoda.app.backends.types import ChatMessage, ReplyFormat, SamplingOptions

Flavor = Literal["vllm", "sglang", "pagoda", "llama.cpp", "openai"]
FLAVORS: tuple[Flavor, ...] = ("vllm", "sglang", "pagoda", "llama.cpp", "openai")

# The sampling fields beyond OpenAI's that each kind of server reads, under its own names;
# "openai" (OpenAI's API, Ollama, anything unknown) gets the standard fields only.
_VLLM_EXTRAS = {"top_k": "top_k", "min_p": "min_p", "repetition_penalty": "repetition_penalty"}
_EXTRAS: dict[Flavor, dict[str, str]] = {
    "vllm": _VLLM_EXTRAS,
    "sglang": _VLLM_EXTRAS,
    "pagoda": _VLLM_EXTRAS,
    "llama.cpp": {"top_k": "top_k", "min_p": "min_p", "repetition_penalty": "repeat_penalty"},
    "openai": {},
}
# The value that turns each option off: left out of the request, so a server's own default
# applies and a server that does not know the field never sees it.
_NEUTRAL = {"top_k": 0, "min_p": 0.0, "repetition_penalty": 1.0, "presence_penalty": 0.0,
            "frequency_penalty": 0.0}


def flavor_of(owned_by: object) -> Flavor:
    """The kind of server, from the `owned_by` of its /v1/models entries."""
    return {"vllm": "vllm", "sglang": "sglang", "pagoda": "pagoda",
            "llamacpp": "llama.cpp"}.get(str(owned_by).lower(), "openai")


# Servers that can go on with an unfinished assistant message (vLLM's continue_final_message).
CONTINUING_FLAVORS: tuple[Flavor, ...] = ("vllm", "sglang", "pagoda")
# Servers that say how far they have read a long prompt when asked (llama.cpp's return_progress).
PROGRESS_FLAVORS: tuple[Flavor, ...] = ("pagoda", "llama.cpp")


def chat_request(model: str, messages: Sequence[ChatMessage], options: SamplingOptions,
                 flavor: Flavor, continue_final_message: bool = False) -> dict:
    """The JSON body of POST /v1/chat/completions, streamed, with usage at the end; with
    `continue_final_message`, the last (assistant) message is continued."""
    body: dict = {
        "model": model,
        "messages": [m.as_dict() for m in messages],
        "stream": True,
        "stream_options": {"include_usage": True},
        "max_tokens": options.max_tokens,
        "temperature": options.temperature,
        "top_p": options.top_p,
    }
    for name in ("presence_penalty", "frequency_penalty"):
        _set_unless_neutral(body, name, name, options)
    for name, wire_name in _EXTRAS[flavor].items():
        _set_unless_neutral(body, name, wire_name, options)
    if options.seed is not None:
        body["seed"] = options.seed
    if options.stop:
        body["stop"] = list(options.stop)
    if flavor in PROGRESS_FLAVORS:
        body["return_progress"] = True
    if continue_final_message:
        body["continue_final_message"] = True
        body["add_generation_prompt"] = False
    _set_tools(body, options)
    if options.enable_thinking is not None:
        _set_thinking(body, options.enable_thinking, flavor)
    if options.reply_format is not None:
        body["response_format"] = response_format(options.reply_format)
    return body


def response_format(reply_format: ReplyFormat) -> dict:
    """OpenAI's response_format: a named json_schema, or json_object without a schema."""
    if reply_format.schema is None:
        return {"type": "json_object"}
    return {"type": "json_schema",
            "json_schema": {"name": reply_format.name, "schema": reply_format.schema}}


def _set_tools(body: dict, options: SamplingOptions) -> None:
    """tools and tool_choice in OpenAI's shapes: a function's name as a named choice."""
    if options.tools:
        body["tools"] = [tool.as_dict() for tool in options.tools]
    if options.tool_choice is None:
        return
    named = named_function(options.tool_choice)
    body["tool_choice"] = (options.tool_choice if named is None
                           else {"type": "function", "function": {"name": named}})


# Servers that pass chat_template_kwargs to the model's template (vLLM's, SGLang's and
# llama.cpp's field), so its thinking switch can be turned.
TEMPLATE_KWARGS_FLAVORS: tuple[Flavor, ...] = ("vllm", "sglang", "pagoda", "llama.cpp")


def _set_thinking(body: dict, enabled: bool, flavor: Flavor) -> None:
    if flavor not in TEMPLATE_KWARGS_FLAVORS:
        raise InvalidRequestError("This chat turns the model's thinking switch, which this "
                                  "server has no field for: set Thinking to the model's default.")
    body["chat_template_kwargs"] = {"enable_thinking": enabled}


def _set_unless_neutral(body: dict, name: str, wire_name: str, options: SamplingOptions) -> None:
    value = getattr(options, name)
    if value != _NEUTRAL[name]:
        body[wire_name] = value
