"""A chat's streamed request to a server's Responses API (POST /v1/responses), for a server that
offers no chat completions: the chat as input items, with what of our settings the API has
fields for.

The Responses API names temperature, top_p and max_output_tokens; the other sampling fields
are left out as they are for any server that does not read them (openai_request's rule). What
a chat asks for explicitly and the API cannot carry (stop sequences, a seed, the thinking
switch, continuing a reply) is refused in words."""

from __future__ import annotations

from collections.abc import Sequence

from pagoda.app.backends.chat.tool_options import TOOL_CHOICE_MODES
from pagoda.app.backends.errors import InvalidRequestError
from pagoda.app.backends.types import ChatMessage, ReplyFormat, SamplingOptions, ToolSpec


def responses_request(model: str, messages: Sequence[ChatMessage],
                      options: SamplingOptions) -> dict:
    """The JSON body of POST /v1/responses, streamed and not stored on the server (the chat
    lives in Pagoda's store and is sent whole each turn)."""
    _refuse_what_it_cannot_carry(options)
    body: dict = {
        "model": model,
        "input": [item for message in messages for item in _items(message)],
        "stream": True,
        "store": False,
        "max_output_tokens": options.max_tokens,
        "temperature": options.temperature,
        "top_p": options.top_p,
    }
    if options.tools:
        body["tools"] = [_tool(tool) for tool in options.tools]
    if options.tool_choice is not None:
        body["tool_choice"] = _tool_choice(options.tool_choice)
    if options.reply_format is not None:
        body["text"] = {"format": _text_format(options.reply_format)}
    return body


def _refuse_what_it_cannot_carry(options: SamplingOptions) -> None:
    asked = [name for name, given in (("stop sequences", bool(options.stop)),
                                      ("a seed", options.seed is not None),
                                      ("the thinking switch", options.enable_thinking is not None))
             if given]
    if asked:
        raise InvalidRequestError(
            f"This server offers only OpenAI's Responses API, which has no field for "
            f"{' or '.join(asked)}: clear them in this chat's settings.")


def _items(message: ChatMessage) -> list[dict]:
    """One chat message as Responses input items: a message, the calls an assistant made, or a
    tool's output for the call it answers."""
    if message.role == "tool":
        return [{"type": "function_call_output", "call_id": message.tool_call_id,
                 "output": message.content}]
    items = []
    if message.images:
        items.append({"type": "message", "role": message.role, "content": _parts(message)})
    elif message.content or not message.tool_calls:
        items.append({"type": "message", "role": message.role, "content": message.content})
    items.extend({"type": "function_call", "call_id": call.id, "name": call.name,
                  "arguments": call.arguments} for call in message.tool_calls)
    return items


def _parts(message: ChatMessage) -> list[dict]:
    """A user's text and images as the Responses API's input parts."""
    text = [{"type": "input_text", "text": message.content}] if message.content else []
    return text + [{"type": "input_image", "image_url": image.data_url()}
                   for image in message.images]


def _tool(tool: ToolSpec) -> dict:
    """A function tool in the Responses shape: its fields at the top, not under "function"."""
    function = tool.as_dict()["function"]
    return {"type": "function", **function}


def _tool_choice(choice: str) -> str | dict:
    """A mode as it is; a function's name as the Responses API's named choice."""
    if choice in TOOL_CHOICE_MODES:
        return choice
    return {"type": "function", "name": choice}


def _text_format(reply_format: ReplyFormat) -> dict:
    if reply_format.schema is None:
        return {"type": "json_object"}
    return {"type": "json_schema", "name": reply_format.name, "schema": reply_format.schema}
