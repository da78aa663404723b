"""Tool calls in OpenAI's shapes, whole (`ParsedReply`) and streamed (`StreamDelta`), and the
`ToolParser` each model family implements.

A parser reads the text the model wrote after its reasoning. Text that is not a call is content.
A call the model wrote wrongly (invalid JSON, no name, arguments that are not an object) is not
dropped: `parse` keeps its text as content, so the user sees what the model wrote.

A streamer must name a call before the call has ended, to stream its arguments as they arrive;
it cannot take that back. So it agrees with `parse` on every reply except one whose call goes
wrong after its name and the start of its arguments went out (a reply cut by max_tokens inside
the arguments, or JSON that breaks later): that call keeps the arguments streamed so far, as
OpenAI's API leaves them when it stops on max_tokens, the text after the break is content, and
the streamer logs a warning."""

from __future__ import annotations

import secrets
import string
from abc import ABC, abstractmethod
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import ClassVar

_ID_ALPHABET = string.ascii_letters + string.digits
_ID_LENGTH = 24


def new_tool_call_id() -> str:
    """An id in OpenAI's shape: "call_" and 24 random letters and digits."""
    return "call_" + "".join(secrets.choice(_ID_ALPHABET) for _ in range(_ID_LENGTH))


@dataclass(frozen=True, slots=True)
class ToolCall:
    """One call of a function; arguments is the JSON text of an object, as in OpenAI's
    `function.arguments`."""

    id: str
    name: str
    arguments: str


@dataclass(slots=True)
class ParsedReply:
    """A whole reply: the text outside the calls, and the calls.

    content is None when the reply holds calls and nothing else but whitespace."""

    content: str | None
    tool_calls: list[ToolCall]


@dataclass(frozen=True, slots=True)
class ToolCallDelta:
    """OpenAI's streamed `delta.tool_calls[i]`: a call's first delta carries its id and name,
    later ones only a fragment of its arguments; the fragments joined are the arguments."""

    index: int
    id: str | None
    name: str | None
    arguments: str


@dataclass(slots=True)
class StreamDelta:
    """What one fed delta of text adds to the reply: content, and calls begun or continued."""

    content: str = ""
    tool_calls: list[ToolCallDelta] = field(default_factory=list)


class ToolCallStreamer(ABC):
    """Reads one reply as it streams. `feed` each new piece of text, then `finish` once."""

    @abstractmethod
    def feed(self, delta_text: str) -> StreamDelta:
        """Reads delta_text; returns what can be shown now (a possible tag start is held)."""

    @abstractmethod
    def finish(self) -> StreamDelta:
        """The reply has ended: returns whatever was held back."""


class ToolParser(ABC):
    """One model family's tool-call syntax."""

    name: ClassVar[str]
    # Whether its tags are special tokens, which the reply's text must then keep.
    reads_special_tokens: ClassVar[bool] = False

    def parse(self, text: str) -> ParsedReply:
        """The calls in a whole reply, and the text outside them."""
        streamer = self._streamer(whole=True)
        return join_deltas([streamer.feed(text), streamer.finish()])

    def streamer(self) -> ToolCallStreamer:
        """A streamer for one reply."""
        return self._streamer(whole=False)

    @abstractmethod
    def _streamer(self, *, whole: bool) -> ToolCallStreamer:
        """The family's streamer; whole: the text comes in one piece, so a call is shown only
        once it has proved valid (parse), never committed to early."""


def join_deltas(deltas: Iterable[StreamDelta]) -> ParsedReply:
    """The whole reply a stream of deltas adds up to."""
    content: list[str] = []
    calls: list[list[str]] = []
    for delta in deltas:
        content.append(delta.content)
        for part in delta.tool_calls:
            if part.index == len(calls):
                assert part.id is not None and part.name is not None, part
                calls.append([part.id, part.name, part.arguments])
            else:
                calls[part.index][2] += part.arguments
    tool_calls = [ToolCall(*call) for call in calls]
    text = "".join(content)
    return ParsedReply(None if tool_calls and not text.strip() else text, tool_calls)
