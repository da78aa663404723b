"""A Messages conversation (`system`, `messages` of content blocks) as the chat messages the chat
endpoint reads: text joins, an assistant's `tool_use` blocks are its tool calls, a user's
`tool_result` blocks are tool messages, and earlier thinking is left out of the prompt, as a chat
client's history leaves reasoning out."""

from __future__ import annotations

import json

from pydantic import ValidationError

from pagoda.engine.server.errors import APIError, validation_error
from pagoda.engine.server.messages_protocol import CacheControl, InputMessage, TextBlock
from pagoda.engine.server.protocol import (
    ChatMessage,
    ContentPart,
    FunctionCall,
    ImageURL,
    ToolCallParam,
)
from pagoda.engine.server.responses_input import within

# The fields each block may have, by the role whose message holds it (beside `type`).
_BLOCK_FIELDS = {
    "user": {"text": {"text", "cache_control", "citations"},
             "image": {"source", "cache_control"},
             "tool_result": {"tool_use_id", "content", "is_error", "cache_control"}},
    "assistant": {"text": {"text", "cache_control", "citations"},
                  "tool_use": {"id", "name", "input", "cache_control"},
                  "thinking": {"thinking", "signature"},
                  "redacted_thinking": {"data"}},
}
# Kept so that a tool which reports failure reads so in the prompt (templates have no flag).
ERROR_PREFIX = "Error: "


def system_messages(system: str | list[dict] | None) -> list[ChatMessage]:
    if system is None:
        return []
    text = system if isinstance(system, str) else _texts(system, "system")
    return [ChatMessage(role="system", content=text)]


def chat_messages(messages: list[InputMessage]) -> list[ChatMessage]:
    """The conversation as chat messages; a tool's result finds its call's name (some templates
    write it) among the calls before it."""
    chat: list[ChatMessage] = []
    names: dict[str, str] = {}
    for index, message in enumerate(messages):
        path = f"messages[{index}]"
        if message.role == "system":
            chat.append(_system_message(message.content, path))
        elif message.role not in _BLOCK_FIELDS:
            raise APIError(400, f"{path}.role={message.role!r}: 'user', 'assistant' or "
                                "'system'", param=f"{path}.role")
        elif isinstance(message.content, str):
            chat.append(ChatMessage(role=message.role, content=message.content))
        elif message.role == "user":
            chat += _user_messages(message.content, path, names)
        else:
            chat.append(_assistant_message(message.content, path, names))
    return chat


def _system_message(content: str | list[dict], path: str) -> ChatMessage:
    """A system message within the conversation, where Claude Code puts its environment's
    description (after the user's first message): a system message at that place in the chat,
    which the model's template writes as it writes system messages."""
    text = content if isinstance(content, str) else _texts(content, f"{path}.content")
    return ChatMessage(role="system", content=text)


def _user_messages(blocks: list[dict], path: str, names: dict[str, str]) -> list[ChatMessage]:
    """Tool results first (Anthropic's order), each a tool message, then the user's text and
    images, in their order."""
    results, parts = [], []
    for j, block in enumerate(blocks):
        where = f"{path}.content[{j}]"
        kind = _checked_kind(block, "user", where)
        if kind == "text":
            parts.append(ContentPart(type="text", text=_text(block, where)))
        elif kind == "image":
            parts.append(_image(block, where))
        else:
            results.append(_tool_result(block, where, names))
    if not parts:
        return results
    if all(part.type == "text" for part in parts):
        return [*results, ChatMessage(role="user", content="".join(p.text for p in parts))]
    return [*results, ChatMessage(role="user", content=parts)]


def _image(block: dict, path: str) -> ContentPart:
    """An image block as the chat endpoint's image part: a base64 source as a data: URL, a url
    source as it is (which the server refuses in words); read where the model takes images."""
    source = block.get("source")
    kind = source.get("type") if isinstance(source, dict) else None
    if kind == "base64":
        media_type, data = source.get("media_type"), source.get("data")
        if not isinstance(media_type, str) or not isinstance(data, str):
            raise APIError(400, f"{path}.source: a base64 image gives its media_type and data",
                           param=f"{path}.source")
        url = f"data:{media_type};base64,{data}"
    elif kind == "url" and isinstance(source.get("url"), str):
        url = source["url"]
    else:
        raise APIError(400, f"{path}.source.type={kind!r}: an image here is 'base64' (or "
                            "'url', which this server does not fetch)", param=f"{path}.source")
    return ContentPart(type="image_url", image_url=ImageURL(url=url), source_path=path,
                       source_url_path=f"{path}.source")


def _assistant_message(blocks: list[dict], path: str, names: dict[str, str]) -> ChatMessage:
    texts, calls = [], []
    for j, block in enumerate(blocks):
        where = f"{path}.content[{j}]"
        kind = _checked_kind(block, "assistant", where)
        if kind == "text":
            texts.append(_text(block, where))
        elif kind == "tool_use":
            calls.append(_tool_call(block, where))
            names[calls[-1].id] = calls[-1].function.name
    return ChatMessage(role="assistant", content="".join(texts) or None,
                       tool_calls=calls or None)


def _checked_kind(block: dict, role: str, path: str) -> str:
    kind = block.get("type")
    allowed = _BLOCK_FIELDS[role].get(kind) if isinstance(kind, str) else None
    if allowed is None:
        kinds = ", ".join(_BLOCK_FIELDS[role])
        raise APIError(400, f"{path}.type={kind!r}: a {role} message here holds {kinds} blocks "
                            "(this model takes text only: no images or documents)",
                       param=f"{path}.type")
    foreign = sorted(block.keys() - allowed - {"type"})
    if foreign:
        raise APIError(400, f"Unrecognized request argument supplied: {path}.{foreign[0]} (a "
                            f"{kind} block has no such field here)", param=f"{path}.{foreign[0]}")
    _check_cache_control(block.get("cache_control"), f"{path}.cache_control")
    return kind


def _check_cache_control(given: object, path: str) -> None:
    if given is None:
        return
    try:
        CacheControl.model_validate(given).check(path)
    except ValidationError as exc:
        raise within(validation_error(exc), path) from exc


def _text(block: dict, path: str) -> str:
    try:
        text = TextBlock.model_validate(block)
    except ValidationError as exc:
        raise within(validation_error(exc), path) from exc
    if text.citations:
        raise APIError(400, f"{path}.citations: this server reads no citations",
                       param=f"{path}.citations")
    return text.text


def _texts(blocks: list[dict], path: str) -> str:
    texts = []
    for j, block in enumerate(blocks):
        where = f"{path}[{j}]"
        if block.get("type") != "text":
            raise APIError(400, f"{where}.type={block.get('type')!r}: only text blocks here "
                                "(this model takes text only)", param=f"{where}.type")
        _check_cache_control(block.get("cache_control"), f"{where}.cache_control")
        texts.append(_text(block, where))
    return "".join(texts)


def _tool_call(block: dict, path: str) -> ToolCallParam:
    for name, kind in (("id", str), ("name", str), ("input", dict)):
        if not isinstance(block.get(name), kind):
            raise APIError(400, f"{path}.{name}: a tool_use block needs its {name} "
                                f"({kind.__name__})", param=f"{path}.{name}")
    arguments = json.dumps(block["input"], ensure_ascii=False)
    return ToolCallParam(id=block["id"], function=FunctionCall(name=block["name"],
                                                               arguments=arguments))


def _tool_result(block: dict, path: str, names: dict[str, str]) -> ChatMessage:
    call_id = block.get("tool_use_id")
    if not isinstance(call_id, str):
        raise APIError(400, f"{path}.tool_use_id: a tool_result names its tool_use's id",
                       param=f"{path}.tool_use_id")
    content = block.get("content", "")
    text = content if isinstance(content, str) else _texts(content, f"{path}.content") \
        if isinstance(content, list) else None
    if text is None:
        raise APIError(400, f"{path}.content: a string or text blocks",
                       param=f"{path}.content")
    is_error = block.get("is_error")
    if is_error is not None and not isinstance(is_error, bool):
        raise APIError(400, f"{path}.is_error: true or false", param=f"{path}.is_error")
    return ChatMessage(role="tool", tool_call_id=call_id, name=names.get(call_id),
                       content=ERROR_PREFIX + text if is_error else text)
