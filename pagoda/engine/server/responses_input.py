"""A Responses conversation as the chat messages the chat endpoint reads: `input` items in,
and a response's output items back as the history the next turn continues."""

from __future__ import annotations

from pydantic import ValidationError

from pagoda.engine.server.errors import APIError, validation_error
from pagoda.engine.server.protocol import ChatMessage, FunctionCall, ImageURL, ToolCallParam
from pagoda.engine.server.protocol import ContentPart as ChatContentPart
from pagoda.engine.server.responses_protocol import ContentPart, InputItem

# The fields each type of input item may have (beside `type`, `id` and `status`).
_ITEM_FIELDS = {
    "message": {"role", "content", "phase"},
    "function_call": {"call_id", "name", "arguments"},
    "function_call_output": {"call_id", "output"},
    "reasoning": {"summary", "content", "encrypted_content"},
}
_MESSAGE_ROLES = ("user", "system", "developer", "assistant")
_TEXT_PARTS = ("input_text", "output_text")


def input_messages(given: str | list[dict], history: tuple[ChatMessage, ...],
                   ) -> list[ChatMessage]:
    """`input` as chat messages: a function call joins the assistant message before it (a
    model's calls and its text are one turn), its output is a tool message."""
    if isinstance(given, str):
        return [ChatMessage(role="user", content=given)]
    messages: list[ChatMessage] = []
    # call_id -> the function, which some templates name in its output's message; the call
    # may be in this input or in the response it continues.
    names = {call.id: call.function.name for message in history
             for call in message.tool_calls or ()}
    for index, raw in enumerate(given):
        item = _input_item(raw, index)
        if item.type == "message":
            messages.append(_message(item, index))
        elif item.type == "function_call":
            names[item.call_id] = item.name
            _add_call(messages, item)
        elif item.type == "function_call_output":
            messages.append(ChatMessage(role="tool", tool_call_id=item.call_id,
                                        name=names.get(item.call_id),
                                        content=_text(item.output, f"input[{index}].output")))
    return messages


def _input_item(raw: dict, index: int) -> InputItem:
    """One item of `input`, checked by its type; an error names the item and its field."""
    kind = raw.get("type", "message")
    allowed = _ITEM_FIELDS.get(kind) if isinstance(kind, str) else None
    if allowed is None:
        raise APIError(400, f"input[{index}].type={kind!r} is not supported by this "
                            "server: it reads message, function_call, function_call_output "
                            "and reasoning items", param=f"input[{index}].type")
    foreign = sorted(raw.keys() - allowed - {"type", "id", "status"})
    if foreign:
        raise APIError(400, f"input[{index}].{foreign[0]}: a {kind} item has no such field "
                            "here", param=f"input[{index}].{foreign[0]}")
    try:
        item = InputItem.model_validate(raw)
    except ValidationError as exc:
        raise within(validation_error(exc), f"input[{index}]") from exc
    needed = {"message": ("role",), "function_call": ("call_id", "name", "arguments"),
              "function_call_output": ("call_id", "output")}.get(item.type, ())
    for name in needed:
        if getattr(item, name) is None:
            raise APIError(400, f"input[{index}].{name} is missing: a {item.type} item needs "
                                f"{', '.join(needed)}", param=f"input[{index}].{name}")
    return item


def within(error: APIError, path: str) -> APIError:
    """An error about a part of `path`, named from the request's top."""
    if error.param is None:
        return APIError(error.status, f"{path}: {error.message}", param=path)
    return APIError(error.status, error.message.replace(error.param, f"{path}.{error.param}", 1),
                    param=f"{path}.{error.param}")


def _message(item: InputItem, index: int) -> ChatMessage:
    if item.role not in _MESSAGE_ROLES:
        raise APIError(400, f"input[{index}].role={item.role!r}: a message's role is one of "
                            f"{', '.join(_MESSAGE_ROLES)}", param=f"input[{index}].role")
    path = f"input[{index}].content"
    content = item.content
    if isinstance(content, list) and any(part.type == "input_image" for part in content):
        return ChatMessage(role=item.role, content=[_chat_part(part, f"{path}[{j}]")
                                                    for j, part in enumerate(content)])
    return ChatMessage(role=item.role, content=_text(content, path))


def _chat_part(part: ContentPart, path: str) -> ChatContentPart:
    """A part of a message with images as the chat endpoint reads it (an image there: read
    where the model takes images, refused in words where not)."""
    if part.type != "input_image":
        return ChatContentPart(type="text", text=_part_text(part, path))
    extra = dict(part.model_extra or {})
    if extra.get("file_id") is not None:
        raise APIError(400, f"{path}.file_id: this server keeps no files; send the image as "
                            "image_url, a data: URL", param=f"{path}.file_id")
    url, detail = extra.pop("image_url", None), extra.pop("detail", None)
    unknown = sorted(name for name, value in extra.items()
                     if name != "file_id" and value is not None)
    if unknown:
        raise APIError(400, f"Unrecognized request argument supplied: {path}.{unknown[0]} (an "
                            "input_image part has no such field)", param=f"{path}.{unknown[0]}")
    if not isinstance(url, str) or not isinstance(detail, str | None):
        raise APIError(400, f"{path}.image_url must be a URL (a data: URL of the image)",
                       param=f"{path}.image_url")
    return ChatContentPart(type="image_url", image_url=ImageURL(url=url, detail=detail),
                           source_path=path, source_url_path=f"{path}.image_url")


def _text(content: str | list | None, path: str) -> str:
    if content is None or isinstance(content, str):
        return content or ""
    return "".join(_part_text(part, f"{path}[{j}]") for j, part in enumerate(content))


def _part_text(part: ContentPart, path: str) -> str:
    if part.type not in _TEXT_PARTS:
        raise APIError(400, f"{path} is an {part.type!r} part: this model takes text only "
                            "(input_text, output_text, and input_image where the model sees "
                            "images)", param=f"{path}.type")
    if part.text is None:
        raise APIError(400, f"{path}.text is missing: a text part needs its text",
                       param=f"{path}.text")
    unknown = sorted(part.model_extra or {})
    if unknown:
        raise APIError(400, f"Unrecognized request argument supplied: {path}.{unknown[0]} (a "
                            "text part has no such field)", param=f"{path}.{unknown[0]}")
    return part.text


def _add_call(messages: list[ChatMessage], item: InputItem) -> None:
    call = ToolCallParam(id=item.call_id, function=FunctionCall(name=item.name,
                                                                arguments=item.arguments))
    last = messages[-1] if messages else None
    if last is not None and last.role == "assistant":
        last.tool_calls = [*(last.tool_calls or []), call]
    else:
        messages.append(ChatMessage(role="assistant", content=None, tool_calls=[call]))


def output_messages(output: list[dict]) -> list[ChatMessage]:
    """The reply as the next turn's history: its text and calls (its reasoning is left out,
    as a chat client's history leaves it)."""
    text = "".join(part["text"] for item in output if item["type"] == "message"
                   for part in item["content"])
    calls = [ToolCallParam(id=item["call_id"], function=FunctionCall(
        name=item["name"], arguments=item["arguments"])) for item in output
        if item["type"] == "function_call"]
    return [ChatMessage(role="assistant", content=text or None, tool_calls=calls or None)]
