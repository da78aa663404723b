"""The JSON export format (lossless, versioned) and the Markdown export (current branch)."""

import json
from dataclasses import asdict, fields
from datetime import datetime
from typing import Any

from .errors import StoreError
from .records import Conversation, GenerationStats, Message, SamplingSettings

FORMAT_NAME = "pagoda-conversations"
FORMAT_VERSION = 1
UNTITLED = "Untitled conversation"

Thread = tuple[Conversation, list[Message]]


def threads_to_json(threads: list[Thread]) -> str:
    document = {
        "format": FORMAT_NAME,
        "version": FORMAT_VERSION,
        "conversations": [_thread_to_dict(c, messages) for c, messages in threads],
    }
    return json.dumps(document, ensure_ascii=False, indent=2)


def threads_from_json(text: str) -> list[Thread]:
    try:
        document = json.loads(text)
        _check_header(document)
        return [_thread_from_dict(item) for item in document["conversations"]]
    except (ValueError, KeyError, TypeError) as error:
        raise StoreError(f"not a valid Pagoda export: {error}") from error


def thread_to_markdown(conversation: Conversation, path: list[Message]) -> str:
    lines = [f"# {conversation.title or UNTITLED}", ""]
    if conversation.model:
        lines += [f"*Model: {conversation.model}*", ""]
    if conversation.system_prompt:
        lines += ["## System", "", conversation.system_prompt, ""]
    for message in path:
        lines += [f"## {message.role.capitalize()}", "", message.content, ""]
        note = _status_note(message)
        if note:
            lines += [note, ""]
    return "\n".join(lines).rstrip("\n") + "\n"


def _status_note(message: Message) -> str | None:
    if message.status == "interrupted":
        return "*(interrupted)*"
    if message.status == "error":
        return f"*(error: {message.error})*"
    if message.status == "streaming":
        return "*(still being written)*"
    return None


def _thread_to_dict(conversation: Conversation, messages: list[Message]) -> dict[str, Any]:
    item = asdict(conversation)
    item["messages"] = [_encode_times(asdict(m)) for m in messages]
    return _encode_times(item)


def _thread_from_dict(item: dict[str, Any]) -> Thread:
    item = _decode_times(dict(item))
    messages = [_message_from_dict(m) for m in item.pop("messages")]
    item["sampling"] = SamplingSettings(**item["sampling"])
    return Conversation(**_only_fields(Conversation, item)), messages


def _message_from_dict(item: dict[str, Any]) -> Message:
    item = _decode_times(dict(item))
    stats = item.get("stats")
    item["stats"] = GenerationStats(**stats) if stats is not None else None
    return Message(**_only_fields(Message, item))


def _check_header(document: Any) -> None:
    if not isinstance(document, dict) or document.get("format") != FORMAT_NAME:
        raise ValueError(f"the file does not say it is a {FORMAT_NAME!r} document")
    if document.get("version") != FORMAT_VERSION:
        raise ValueError(f"unsupported format version {document.get('version')!r}")


def _only_fields(cls: type, item: dict[str, Any]) -> dict[str, Any]:
    names = {f.name for f in fields(cls)}
    return {key: value for key, value in item.items() if key in names}


TIME_KEYS = ("created_at", "updated_at", "deleted_at")


def _encode_times(item: dict[str, Any]) -> dict[str, Any]:
    for key in TIME_KEYS:
        if isinstance(item.get(key), datetime):
            item[key] = item[key].isoformat(timespec="microseconds")
    return item


def _decode_times(item: dict[str, Any]) -> dict[str, Any]:
    for key in TIME_KEYS:
        if isinstance(item.get(key), str):
            item[key] = _parse_time(item[key])
    return item


def _parse_time(text: str) -> datetime:
    value = datetime.fromisoformat(text)
    if value.tzinfo is None:
        raise ValueError(f"timestamp {text!r} has no time zone")
    return value
