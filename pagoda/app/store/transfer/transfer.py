"""The JSON export format (lossless, versioned) and the Markdown export (current branch)."""

import base64
import json
from dataclasses import asdict, replace
from datetime import datetime
from typing import Any

from ..errors import ImportValidationError
from ..records import Conversation, Message, MessageImage, Thread
from . import validation

FORMAT_NAME = "pagoda-conversations"
FORMAT_VERSION = 1
UNTITLED = "Untitled conversation"
DOCUMENT = "the document"


def threads_to_json(threads: list[Thread]) -> str:
    document = {
        "format": FORMAT_NAME,
        "version": FORMAT_VERSION,
        "conversations": [_thread_to_dict(thread) for thread in threads],
    }
    return json.dumps(document, ensure_ascii=False, indent=2)


def threads_from_json(text: str) -> list[Thread]:
    """Every conversation of an export, checked field by field; ImportValidationError if not."""
    document = validation.OBJECT.check(_parse(text), DOCUMENT)
    _check_header(document)
    return validation.threads_of(validation.required(document, "conversations"))


def _parse(text: str) -> Any:
    try:
        return json.loads(text)
    except RecursionError:
        raise ImportValidationError(DOCUMENT, "is nested too deeply to be an export") from None
    except ValueError as error:
        raise ImportValidationError(DOCUMENT, f"is not JSON ({error})") from error


def _check_header(document: dict[str, Any]) -> None:
    name = validation.required(document, "format")
    if name != FORMAT_NAME:
        raise ImportValidationError(
            "format", f"must be {FORMAT_NAME!r}, not {validation.describe(name)}"
        )
    version = validation.required(document, "version")
    if type(version) is not int or version != FORMAT_VERSION:
        raise ImportValidationError(
            "version",
            f"must be {FORMAT_VERSION}, the version this Pagoda reads, not "
            f"{validation.describe(version)}",
        )


def thread_to_markdown(conversation: Conversation, path: list[Message]) -> str:
    lines = [f"# {conversation.title or UNTITLED}", ""]
    if conversation.model:
        lines += [f"*Model: {conversation.model}*", ""]
    if conversation.system_prompt:
        lines += ["## System", "", conversation.system_prompt, ""]
    for message in path:
        lines += _message_lines(message)
        note = _status_note(message)
        if note:
            lines += [note, ""]
    return "\n".join(lines).rstrip("\n") + "\n"


def _message_lines(message: Message) -> list[str]:
    """A message's heading and text; an assistant's reasoning as a quote above its answer, its
    calls below it; a tool's result under the call's name."""
    if message.role == "tool":
        return [f"## Tool: {message.tool_name} ({message.finish_reason})", "", "```",
                message.content, "```", ""]
    lines = [f"## {message.role.capitalize()}", ""]
    if message.reasoning:
        lines += ["> *Thinking*", ">", *(f"> {line}".rstrip() for line in
                                        message.reasoning.splitlines()), ""]
    if message.content:
        lines += [message.content, ""]
    # The Markdown export is text: an image is named, its bytes are in the JSON export.
    lines += [f"*Image: {kept.image.name} ({kept.image.width} x {kept.image.height})*"
              for kept in message.images]
    lines += [""] if message.images else []
    lines += [f"*Called `{call.name}` with* `{call.arguments}`" for call in message.tool_calls]
    return lines + ([""] if message.tool_calls else [])


def _status_note(message: Message) -> str | None:
    if message.status == "interrupted":
        return "*(interrupted)*"
    if message.status == "error":
        return f"*(error: {message.error})*"
    if message.status == "streaming":
        return "*(still being written)*"
    return None


def _thread_to_dict(thread: Thread) -> dict[str, Any]:
    item = asdict(thread.conversation)
    item["messages"] = [_message_to_dict(m) for m in thread.messages]
    item["documents"] = [{"id": d.attachment_id, "message_id": d.message_id,
                          **asdict(d.document)} for d in thread.documents]
    return _encode_times(item)


def _message_to_dict(message: Message) -> dict[str, Any]:
    """A message as exported: its images' bytes as base64 text."""
    item = asdict(replace(message, images=()))
    item["images"] = [_image_to_dict(image) for image in message.images]
    return _encode_times(item)


def _image_to_dict(kept: MessageImage) -> dict[str, Any]:
    image = kept.image
    return {"id": kept.id, "name": image.name, "mime_type": image.mime_type,
            "width": image.width, "height": image.height,
            "data": base64.b64encode(image.data).decode("ascii")}


TIME_KEYS = ("created_at", "updated_at", "deleted_at")


def _encode_times(item: dict[str, Any]) -> dict[str, Any]:
    for key in TIME_KEYS:
        if isinstance(item.get(key), datetime):
            item[key] = item[key].isoformat(timespec="microseconds")
    return item
