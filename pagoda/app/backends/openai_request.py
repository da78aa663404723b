"""A chat's streamed request to an OpenAI-compatible server, with our sampling in its words."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

from pagoda.app.backends.errors import InvalidRequestError
from pagoda.app.backends.tool_options import openai_tool_choice
from pagoda.app.backends.types import ChatMessage, ReplyFormat, SamplingOptions
from pagoda.engine.sampling.fields import SAMPLING_FIELDS, SamplingField

Flavor = Literal["vllm", "sglang", "pagoda", "llama.cpp", "openai"]
FLAVORS: tuple[Flavor, ...] = ("vllm", "sglang", "pagoda", "llama.cpp", "openai")



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
    }
    for field in SAMPLING_FIELDS:
        _set_sampling(body, field, flavor, options)
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
    if options.tool_choice is not None:
        body["tool_choice"] = openai_tool_choice(options.tool_choice)


# Servers that pass chat_template_kwargs to the model's template (vLLM's, SGLang's and
# llama.cpp's field), so its thinking switch can be turned.
TEMPLATE_KWARGS_FLAVORS: tuple[Flavor, ...] = ("vllm", "sglang", "pagoda", "llama.cpp")


def _set_thinking(body: dict, enabled: bool, flavor: Flavor) -> None:
    if flavor not in TEMPLATE_KWARGS_FLAVORS:
        raise InvalidRequestError("This chat turns the model's thinking switch, which this "
                                  "server has no field for: set Thinking to the model's default.")
    body["chat_template_kwargs"] = {"enable_thinking": enabled}


def _set_sampling(body: dict, field: SamplingField, flavor: Flavor,
                  options: SamplingOptions) -> None:
    """A sampling field under the name this kind of server reads it by, where it reads it
    ("openai": OpenAI's API, Ollama, anything unknown, reads OpenAI's fields only). A neutral
    value is left out, so a server's own default applies and one that does not know the
    field never sees it."""
    value = getattr(options, field.name)
    if value == field.neutral and not field.always_sent:
        return
    wire_name = _wire_name(field, flavor)
    if wire_name is not None:
        body[wire_name] = value


def _wire_name(field: SamplingField, flavor: Flavor) -> str | None:
    if field.openai or flavor == "pagoda":
        return field.name
    return field.servers.get(flavor)
