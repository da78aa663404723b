"""Checking an export document before anything is imported: every field, every id, the tree.

A problem is an ImportValidationError naming the field's path, such as
`conversations[2].messages[5].role`. The checks are written here rather than with a schema
library so the store depends on nothing more. Nothing recurses over the document: its shape is
fixed, and deeper nesting in a field is just a value of the wrong type.
"""

import base64
import binascii
import math
from collections.abc import Callable
from dataclasses import MISSING, dataclass, fields, replace
from datetime import UTC, datetime
from typing import Any

from pagoda.engine.sampling.fields import SAMPLING_FIELDS, SamplingField

from ..documents.images import IMAGE_TYPES, MAX_IMAGE_BYTES, MAX_IMAGES_PER_MESSAGE
from ..errors import ImportValidationError
from ..records import (
    ROLES,
    STATUSES,
    AttachedDocument,
    AttachmentChunk,
    Citation,
    Conversation,
    GenerationStats,
    Message,
    MessageImage,
    NewAttachment,
    NewImage,
    SamplingSettings,
    Thread,
    ToolCall,
)

MAX_ID = 2**63 - 1  # SQLite's INTEGER
SHOWN_CHARS = 40
# Each field is bounded by the most the app itself writes into it, checked before anything is
# stored (indexing text for search costs time with every character: 200 MB took minutes). The
# longest text the app keeps is a document's (pagoda.app.components.documents.document.MAX_TEXT_CHARS);
# a message, its thinking or a tool call's arguments must fit a model's context, far less.
MAX_TEXT_CHARS = 20_000_000
# A title, a name or an id is one line: Qt's line edit (the sidebar's rename box) holds at most
# 32,767 characters, and models', tools' and files' names are far shorter.
MAX_NAME_CHARS = 32_767
MAX_TIME_CHARS = 64  # an ISO 8601 time with microseconds and an offset is 32


@dataclass(frozen=True, slots=True)
class Kind:
    """What a field may hold: `expected` names it in errors, `read` checks range and converts."""

    expected: str
    is_type: Callable[[Any], bool]
    read: Callable[[Any, str], Any] = lambda value, where: value
    nullable: bool = False

    def check(self, value: Any, where: str) -> Any:
        if value is None and self.nullable:
            return None
        if not self.is_type(value):
            null = " or null" if self.nullable else ""
            raise ImportValidationError(
                where, f"must be {self.expected}{null}, not {describe(value)}"
            )
        return self.read(value, where)


def maybe(kind: Kind) -> Kind:
    return replace(kind, nullable=True)


def threads_of(conversations: Any) -> list[Thread]:
    """The document's `conversations`, checked, or ImportValidationError for the first problem."""
    items = ARRAY.check(conversations, "conversations")
    claims: Claims = {}
    return [_thread(item, f"conversations[{i}]", claims) for i, item in enumerate(items)]


def describe(value: Any) -> str:
    """A value as it looks in JSON, short, and never by walking a nested one."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, dict):
        return "an object"
    if isinstance(value, list):
        return "an array"
    if value == "":
        return "an empty string"
    shown = _shortened(value)
    return f"a string {shown}" if isinstance(value, str) and value[0].isdigit() else shown


def _shortened(value: Any) -> str:
    """repr() of the value's start: a long string is cut before repr() copies it."""
    text = repr(value[:SHOWN_CHARS + 1] if isinstance(value, str) else value)
    return text if len(text) <= SHOWN_CHARS else text[:SHOWN_CHARS] + "…"


# -- kinds of field --------------------------------------------------------------------------


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _finite(value: float, where: str) -> float:
    try:
        number = float(value)
    except OverflowError:
        raise ImportValidationError(where, f"is too large ({describe(value)})") from None
    if not math.isfinite(number):
        raise ImportValidationError(where, f"must be a finite number, not {number!r}")
    return number


def _in_column(minimum: int) -> Callable[[int, str], int]:
    def read(value: int, where: str) -> int:
        if value < minimum:
            raise ImportValidationError(where, f"must be at least {minimum}, not {value}")
        if value > MAX_ID:
            raise ImportValidationError(where, f"is too large ({describe(value)}; at most 2^63-1)")
        return value

    return read


def _time(value: str, where: str) -> datetime:
    try:
        parsed = datetime.fromisoformat(value)
    except ValueError:
        raise ImportValidationError(
            where, f"must be an ISO 8601 time, not {describe(value)}"
        ) from None
    if parsed.tzinfo is None:
        raise ImportValidationError(where, f"has no time zone ({value!r})")
    try:
        return parsed.astimezone(UTC)
    except OverflowError:
        raise ImportValidationError(where, f"is out of range ({value!r})") from None


def _one_of(options: tuple[str, ...]) -> Kind:
    names = ", ".join(repr(option) for option in options)
    return Kind(f"one of {names}", lambda value: isinstance(value, str) and value in options)


def _is_text(value: Any) -> bool:
    return isinstance(value, str)


def _at_most(limit: int) -> Callable[[str, str], str]:
    def read(value: str, where: str) -> str:
        if len(value) > limit:
            raise ImportValidationError(
                where, f"is {len(value):,} characters long, more than Pagoda writes there (at "
                       f"most {limit:,})")
        return value

    return read


def _bounded_time(value: str, where: str) -> datetime:
    return _time(_at_most(MAX_TIME_CHARS)(value, where), where)


OBJECT = Kind("an object", lambda value: isinstance(value, dict))
ARRAY = Kind("an array", lambda value: isinstance(value, list))
TEXT = Kind("a string", _is_text, _at_most(MAX_TEXT_CHARS))
NAME = Kind("a string", _is_text, _at_most(MAX_NAME_CHARS))
FLAG = Kind("true or false", lambda value: isinstance(value, bool))
NUMBER = Kind("a number", _is_number, _finite)
INTEGER = Kind("a whole number", _is_int)
COUNT = Kind("a whole number", _is_int, _in_column(0))
ID = Kind("a whole number", _is_int, _in_column(1))
TIME = Kind("an ISO 8601 time", _is_text, _bounded_time)


def _record(cls: type, kinds: dict[str, Kind], item: dict[str, Any], where: str) -> Any:
    """`cls` from the fields of `item` named in `kinds`; a field with a default may be missing."""
    values = {}
    for name, has_default in ((f.name, f.default is not MISSING) for f in fields(cls)):
        if name in item:
            values[name] = kinds[name].check(item[name], f"{where}.{name}")
        elif not has_default:
            raise ImportValidationError(f"{where}.{name}", "is missing")
    return cls(**values)


def sampling_setting(name: str, value: Any) -> Any:
    """One field of SamplingSettings, checked as an import checks it and as the field holds it
    (a list of tools as a tuple); ImportValidationError where it does not fit."""
    return SAMPLING[name].check(value, name)


def _sampling(value: dict[str, Any], where: str) -> SamplingSettings:
    return _record(SamplingSettings, SAMPLING, value, where)


def _stats(value: dict[str, Any], where: str) -> GenerationStats:
    return _record(GenerationStats, STATS, value, where)


def _sampling_kind(field: SamplingField) -> Kind:
    """A sampling knob of the table: a whole number or a number (its range is the engine's to
    check, as for a chat made here)."""
    return INTEGER if field.kind is int else NUMBER


SAMPLING = {
    **{field.name: _sampling_kind(field) for field in SAMPLING_FIELDS},
    "max_tokens": INTEGER,
    "seed": maybe(INTEGER),
    "enable_thinking": maybe(FLAG),
    "tools": Kind("an array", ARRAY.is_type, lambda value, where: _names(value, where)),
}
STATS = {
    "model": maybe(NAME),
    "ttft_s": maybe(NUMBER),
    "tokens_per_s": maybe(NUMBER),
    "cached_tokens": maybe(COUNT),
}
CONVERSATION = {
    "id": ID,
    "title": maybe(NAME),
    "created_at": TIME,
    "updated_at": TIME,
    "model": maybe(NAME),
    "system_prompt": maybe(TEXT),
    "sampling": Kind("an object", OBJECT.is_type, _sampling),
    "pinned": FLAG,
    "archived": FLAG,
    "deleted_at": maybe(TIME),
    "leaf_id": maybe(ID),
}
MESSAGE = {
    "id": ID,
    "conversation_id": ID,
    "parent_id": maybe(ID),
    "role": _one_of(ROLES),
    "content": TEXT,
    "created_at": TIME,
    "status": _one_of(STATUSES),
    "finish_reason": maybe(NAME),
    "prompt_tokens": maybe(COUNT),
    "completion_tokens": maybe(COUNT),
    "stats": maybe(Kind("an object", OBJECT.is_type, _stats)),
    "error": maybe(TEXT),
    "reasoning": maybe(TEXT),
    "reasoning_s": maybe(NUMBER),
    "tool_calls": Kind("an array", ARRAY.is_type, lambda value, where: _tool_calls(value, where)),
    "tool_call_id": maybe(NAME),
    "tool_name": maybe(NAME),
    "sources": Kind("an array", ARRAY.is_type, lambda value, where: _citations(value, where)),
    "images": Kind("an array", ARRAY.is_type, lambda value, where: _images(value, where)),
}
TOOL_CALL = {"id": NAME, "name": NAME, "arguments": TEXT}
CHUNK = {"ordinal": COUNT, "text": TEXT, "page": maybe(COUNT), "heading": maybe(TEXT),
         "start": COUNT}
DOCUMENT = {"message_id": ID, "name": NAME, "kind": NAME, "size_bytes": COUNT, "text": TEXT,
            "pages": maybe(COUNT),
            "page_starts": Kind("an array", ARRAY.is_type, lambda value, where: tuple(
                COUNT.check(item, f"{where}[{i}]") for i, item in enumerate(value))),
            "chunks": Kind("an array", ARRAY.is_type, lambda value, where: _chunks(value, where))}


def _chunks(items: list[Any], where: str) -> tuple[AttachmentChunk, ...]:
    return tuple(_record(AttachmentChunk, CHUNK, OBJECT.check(item, f"{where}[{i}]"),
                         f"{where}[{i}]") for i, item in enumerate(items))
# A source's attachment_id is 0 where its document is not kept (see _check_citations).
CITATION = {"number": COUNT, "attachment_id": COUNT, "name": NAME, "ordinal": COUNT,
            "page": maybe(COUNT), "heading": maybe(TEXT)}


def _citations(items: list[Any], where: str) -> tuple[Citation, ...]:
    return tuple(_record(Citation, CITATION, OBJECT.check(item, f"{where}[{i}]"), f"{where}[{i}]")
                 for i, item in enumerate(items))


def _image_data(value: Any, where: str) -> bytes:
    """An image's base64 text, bounded before it is decoded (four characters hold three
    bytes), decoded."""
    if len(value) // 4 * 3 > MAX_IMAGE_BYTES + 3:
        raise ImportValidationError(where, f"holds about {len(value) // 4 * 3:,} bytes, over the "
                                           f"{MAX_IMAGE_BYTES:,} an image may be")
    try:
        return base64.b64decode(value, validate=True)
    except (binascii.Error, ValueError) as error:
        raise ImportValidationError(where, f"is not base64 ({error})") from None


# A side in pixels: at least one, at most what SQLite's INTEGER holds (the app bounds it more).
IMAGE = {"id": ID, "name": NAME, "mime_type": _one_of(IMAGE_TYPES), "width": ID, "height": ID,
         "data": Kind("a base64 string", _is_text, _image_data)}


def _images(items: list[Any], where: str) -> tuple[MessageImage, ...]:
    """A message's images; their message_id is the message's, set by _message."""
    if len(items) > MAX_IMAGES_PER_MESSAGE:
        raise ImportValidationError(where, f"holds {len(items)} images, over the "
                                           f"{MAX_IMAGES_PER_MESSAGE} a message may have")
    images = []
    for i, item in enumerate(items):
        place = f"{where}[{i}]"
        OBJECT.check(item, place)
        values = {name: kind.check(required(item, name, place), f"{place}.{name}")
                  for name, kind in IMAGE.items()}
        image_id = values.pop("id")
        images.append(MessageImage(image_id, 0, NewImage(**values)))
    return tuple(images)


def _names(items: list[Any], where: str) -> tuple[str, ...]:
    return tuple(NAME.check(item, f"{where}[{i}]") for i, item in enumerate(items))


def _tool_calls(items: list[Any], where: str) -> tuple[ToolCall, ...]:
    calls = []
    for i, item in enumerate(items):
        OBJECT.check(item, f"{where}[{i}]")
        calls.append(_record(ToolCall, TOOL_CALL, item, f"{where}[{i}]"))
    return tuple(calls)


# -- the document, its conversations and their trees -----------------------------------------


def required(item: dict[str, Any], name: str, where: str = "") -> Any:
    if name not in item:
        raise ImportValidationError(f"{where}.{name}".lstrip("."), "is missing")
    return item[name]


Claims = dict[tuple[str, int], str]
"""Where each conversation id and each message id was first seen: each is unique in a document."""


def _claim(claims: Claims, kind: str, key: int, where: str) -> None:
    if (kind, key) in claims:
        raise ImportValidationError(f"{where}.id", f"{key} is also the id of {claims[kind, key]}")
    claims[kind, key] = where


def _thread(item: Any, where: str, claims: Claims) -> Thread:
    OBJECT.check(item, where)
    conversation: Conversation = _record(Conversation, CONVERSATION, item, where)
    _claim(claims, "conversation", conversation.id, where)
    items = ARRAY.check(required(item, "messages", where), f"{where}.messages")
    places = [f"{where}.messages[{i}]" for i in range(len(items))]
    messages = [_message(one, place) for one, place in zip(items, places, strict=True)]
    for message, place in zip(messages, places, strict=True):
        _claim(claims, "message", message.id, place)
        for j, image in enumerate(message.images):
            _claim(claims, "image", image.id, f"{place}.images[{j}]")
    _check_tree(conversation, messages, places, where)
    documents = _documents(item, messages, where, claims)
    _check_citations(messages, places, documents)
    return Thread(conversation, messages, documents)


def _documents(item: dict[str, Any], messages: list[Message], where: str,
               claims: Claims) -> list[AttachedDocument]:
    """The thread's documents (an export made before documents has none), each attached to a
    user message of the thread, with passages that are its own text."""
    users = {m.id for m in messages if m.role == "user"}
    items = ARRAY.check(item.get("documents", []), f"{where}.documents")
    documents = []
    for i, one in enumerate(items):
        place = f"{where}.documents[{i}]"
        OBJECT.check(one, place)
        attachment_id = maybe(ID).check(one.get("id"), f"{place}.id")
        if attachment_id is not None:
            _claim(claims, "document", attachment_id, place)
        message_id = ID.check(required(one, "message_id", place), f"{place}.message_id")
        if message_id not in users:
            raise ImportValidationError(f"{place}.message_id",
                                        f"{message_id} is not a user message of this conversation")
        document: NewAttachment = _record(NewAttachment, DOCUMENT, one, place)
        _check_pages(document, place)
        _check_passages(document, place)
        documents.append(AttachedDocument(message_id, document, attachment_id))
    return documents


def _check_pages(document: NewAttachment, place: str) -> None:
    starts = document.page_starts
    if list(starts) != sorted(starts) or (starts and starts[-1] > len(document.text)):
        raise ImportValidationError(f"{place}.page_starts",
                                    f"must rise and lie inside the document's text "
                                    f"({len(document.text):,} characters)")


def _check_passages(document: NewAttachment, place: str) -> None:
    """Each passage is the document's text from where it says it starts, and has a number of
    its own: a reply's sources open it by that number."""
    numbers: set[int] = set()
    for i, chunk in enumerate(document.chunks):
        where = f"{place}.chunks[{i}]"
        if chunk.ordinal in numbers:
            raise ImportValidationError(f"{where}.ordinal", f"{chunk.ordinal} is also the number "
                                                            "of another passage of this document")
        numbers.add(chunk.ordinal)
        if not document.text.startswith(chunk.text, chunk.start):
            raise ImportValidationError(f"{where}.text", f"is not in the document: its text from "
                                                         f"character {chunk.start} reads otherwise")


def _check_citations(messages: list[Message], places: list[str],
                     documents: list[AttachedDocument]) -> None:
    """A source that names a document of this export is one of its passages, under its name.
    (One that names no such document, such as a file of the chat's folder, which exports leave
    out, is imported as a passage no longer kept.)"""
    exported = {d.attachment_id: (d.document.name, {chunk.ordinal for chunk in d.document.chunks})
                for d in documents if d.attachment_id is not None}
    for message, place in zip(messages, places, strict=True):
        for j, citation in enumerate(message.sources):
            if citation.attachment_id not in exported:
                continue
            name, ordinals = exported[citation.attachment_id]
            where = f"{place}.sources[{j}]"
            if citation.name != name:
                raise ImportValidationError(
                    f"{where}.name", f"{describe(citation.name)} is not the name of document "
                                     f"{citation.attachment_id} ({describe(name)})")
            if citation.ordinal not in ordinals:
                raise ImportValidationError(
                    f"{where}.ordinal", f"is {citation.ordinal}, a passage document "
                                        f"{citation.attachment_id} does not have")


def _message(item: Any, where: str) -> Message:
    OBJECT.check(item, where)
    message: Message = _record(Message, MESSAGE, item, where)
    if message.images and message.role != "user":
        raise ImportValidationError(f"{where}.images",
                                    f"come with a user's message, not a {message.role}'s")
    message = replace(message, images=tuple(replace(image, message_id=message.id)
                                            for image in message.images))
    if message.tool_calls and message.role != "assistant":
        raise ImportValidationError(f"{where}.tool_calls",
                                    f"belong to an assistant's message, not a {message.role}'s")
    if (message.tool_call_id is None) == (message.role == "tool"):
        raise ImportValidationError(f"{where}.tool_call_id",
                                    "names the call a tool message answers, and only a tool "
                                    "message has one")
    return message


def _check_tree(
    conversation: Conversation, messages: list[Message], places: list[str], where: str
) -> None:
    ids = {m.id for m in messages}
    for message, place in zip(messages, places, strict=True):
        if message.conversation_id != conversation.id:
            raise ImportValidationError(
                f"{place}.conversation_id",
                f"{message.conversation_id} is not this conversation's id ({conversation.id})",
            )
        if message.parent_id is not None and message.parent_id not in ids:
            raise ImportValidationError(
                f"{place}.parent_id", f"{message.parent_id} is not a message of this conversation"
            )
    if conversation.leaf_id is not None and conversation.leaf_id not in ids:
        raise ImportValidationError(
            f"{where}.leaf_id", f"{conversation.leaf_id} is not a message of this conversation"
        )
    _check_no_cycles(messages, places)


def _check_no_cycles(messages: list[Message], places: list[str]) -> None:
    """Walk up from every message, iteratively, remembering the ones known to reach a root."""
    parent_of = {m.id: m.parent_id for m in messages}
    place_of = {m.id: place for m, place in zip(messages, places, strict=True)}
    reaches_root: set[int] = set()
    for start in parent_of:
        trail: dict[int, None] = {}
        mid: int | None = start
        while mid is not None and mid not in reaches_root:
            if mid in trail:
                raise ImportValidationError(
                    f"{place_of[mid]}.parent_id",
                    f"makes a cycle: message {mid} would be its own ancestor",
                )
            trail[mid] = None
            mid = parent_of[mid]
        reaches_root.update(trail)
