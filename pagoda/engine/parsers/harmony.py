"""gpt-oss's harmony format: a reply is a run of messages, each
`<|start|>{role}<|channel|>{channel}<|message|>{text}<|end|>`, the first one's `<|start|>assistant`
already in the prompt. The analysis channel is the reasoning (`reasoning_content`); a message
addressed `to=functions.NAME` (in its role or its channel part, with `<|constrain|>json` or
`json` after) is a call of NAME whose text is its JSON arguments, ended by `<|call|>`; the final
channel, the commentary channel without a recipient (a preamble to the user) and any other
message (another recipient, another channel) is content. `<|return|>` ends the reply.
`<|call|>` and `<|return|>` are stop tokens, so the text usually ends without them. A frame
token ends its message wherever it comes (inside a JSON string too): the model writes it as
one special token, never as text.

Read as the other families are (pagoda/engine/parsers/call_streamer.py): one set of states for a whole
reply and a stream, so both agree at every chunk boundary; a call's arguments stream as they
arrive once its first `{` is written, and a call whose text is no JSON object is content. A
message whose header runs past `MAX_HEADER_CHARS` without `<|message|>` is no header: its text
is content. The frame tokens are special tokens, so the detokenizer must keep them."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import ClassVar

from pagoda.engine.parsers.call_streamer import CallStreamer
from pagoda.engine.parsers.json_call import JsonValueScanner
from pagoda.engine.parsers.reply import ReplyDelta, ReplyParts
from pagoda.engine.parsers.tags import partial_tag_length
from pagoda.engine.parsers.tool_calls import StreamDelta, join_deltas

START, CHANNEL, MESSAGE = "<|start|>", "<|channel|>", "<|message|>"
CONSTRAIN, END, CALL, RETURN = "<|constrain|>", "<|end|>", "<|call|>", "<|return|>"
# Where one message's text ends, and where the next one's header begins (the role implied
# when `<|channel|>` follows a message's end at once).
_ENDS = (END, CALL, RETURN)
# Where a reply ends: at its call, or once its answer is given.
REPLY_ENDS = (CALL, RETURN)
_HEADS = (START, CHANNEL)
_MARKERS = _ENDS + _HEADS
# Longer than any header the format writes (a role, a channel, a recipient naming a function,
# a content type): text past it with no `<|message|>` is not held back as a header.
MAX_HEADER_CHARS = 256
_FUNCTIONS = "functions."
_JSON_SPACE = " \t\r\n"


def is_harmony_template(chat_template: str) -> bool:
    """Whether a chat template writes harmony's frames (gpt-oss's does)."""
    return CHANNEL in chat_template and MESSAGE in chat_template


@dataclass(frozen=True, slots=True)
class Header:
    """What a message's header says: its channel and to whom it goes (None where not given)."""

    channel: str | None
    recipient: str | None

    @classmethod
    def read(cls, text: str) -> Header:
        """The last `<|channel|>` names the channel: gpt-oss sometimes writes a stray one first
        (`<|channel|>commentary to=assistant<|channel|>analysis`)."""
        role_part, has_channel, channel_part = text.rpartition(CHANNEL)
        if not has_channel:
            role_part, channel_part = channel_part, ""
        channel_words = channel_part.replace(CONSTRAIN, " ").split()
        words = role_part.replace(CHANNEL, " ").replace(CONSTRAIN, " ").split() + \
            channel_words[1:]
        recipient = next((w[len("to="):] for w in words if w.startswith("to=")), None)
        return cls(channel_words[0] if channel_words else None, recipient or None)

    def function(self) -> str | None:
        """The function a call message names; None for any other message."""
        if self.recipient is None or not self.recipient.startswith(_FUNCTIONS):
            return None
        return self.recipient[len(_FUNCTIONS):] or None


@dataclass(frozen=True, slots=True)
class HarmonyParser:
    """Reads harmony replies; reads_calls: messages to functions are tool calls (else, with no
    tools offered, their text is content)."""

    reads_calls: bool = True
    has_reasoning: ClassVar[bool] = True
    reads_special_tokens: ClassVar[bool] = True

    def parse(self, text: str, *, starts_in_reasoning: bool = False) -> ReplyParts:
        """The parts of a whole reply; reasoning is None where it had no analysis message."""
        streamer = self._streamer(starts_in_reasoning, whole=True)
        deltas = [streamer.feed(text), streamer.finish()]
        calls = join_deltas(StreamDelta(d.content, d.tool_calls) for d in deltas)
        reasoning = "".join(d.reasoning for d in deltas) if streamer.saw_reasoning else None
        return ReplyParts(reasoning, calls.content, calls.tool_calls)

    def streamer(self, *, starts_in_reasoning: bool = False) -> HarmonyStreamer:
        return self._streamer(starts_in_reasoning, whole=False)

    def _streamer(self, starts_in_reasoning: bool, *, whole: bool) -> HarmonyStreamer:
        if starts_in_reasoning:
            raise ValueError("a harmony reply opens its own channels: the prompt cannot open "
                             "its reasoning")
        return HarmonyStreamer(reads_calls=self.reads_calls, whole=whole)


class HarmonyStreamer(CallStreamer):
    """States: a header (up to `<|message|>`), a message's text (reasoning, content or a call's
    arguments, up to its end), and between messages. `feed` and `finish` return ReplyDelta."""

    def __init__(self, *, reads_calls: bool, whole: bool = False) -> None:
        super().__init__(whole=whole)
        self._reads_calls = reads_calls
        self._step = self._in_header
        self._reasoning = ""
        self.saw_reasoning = False

    def feed(self, delta_text: str) -> ReplyDelta:  # type: ignore[override]
        return self._with_reasoning(super().feed(delta_text))

    def finish(self) -> ReplyDelta:  # type: ignore[override]
        return self._with_reasoning(super().finish())

    def _with_reasoning(self, delta: StreamDelta) -> ReplyDelta:
        reasoning, self._reasoning = self._reasoning, ""
        return ReplyDelta(reasoning, delta.content, delta.tool_calls)

    def _in_header(self) -> bool:
        at = self._buffer.find(MESSAGE, 0, MAX_HEADER_CHARS + len(MESSAGE))
        if at < 0:
            if not self._ended and len(self._buffer) < MAX_HEADER_CHARS + len(MESSAGE):
                return False
            self._step = self._in_stray_text
            return True
        header = Header.read(self._buffer[:at])
        self._buffer = self._buffer[at + len(MESSAGE):]
        self._step = self._body_step(header)
        return True

    def _body_step(self, header: Header) -> Callable[[], bool]:
        name = header.function() if self._reads_calls else None
        if name is not None:
            self._name = name
            self._arguments = JsonValueScanner()
            return self._in_call
        if header.channel == "analysis":
            self.saw_reasoning = True
            return self._in_reasoning
        return self._in_content

    def _in_reasoning(self) -> bool:
        return self._read_text(self._think)

    def _in_content(self) -> bool:
        return self._read_text(self._show)

    def _in_stray_text(self) -> bool:
        """Text where a header should be, which is none: content up to a message's end."""
        return self._read_text(self._show, _ENDS)

    def _think(self, text: str) -> None:
        self._reasoning += text

    def _read_text(self, out: Callable[[str], None], markers: tuple[str, ...] = _MARKERS) -> bool:
        """Passes the message's text to out up to its end (a possible marker's start held)."""
        at, marker = _first_marker(self._buffer, markers)
        if marker is None:
            keep = 0 if self._ended else partial_tag_length(self._buffer, markers)
            cut = len(self._buffer) - keep
            out(self._buffer[:cut])
            self._buffer = self._buffer[cut:]
            return False
        out(self._buffer[:at])
        self._buffer = self._buffer[at:]
        return self._end_message()

    def _end_message(self) -> bool:
        """At a marker: past a message's end, wait for the next header; a header comes now."""
        for end in _ENDS:
            if self._buffer.startswith(end):
                self._buffer = self._buffer[len(end):]
                self._step = self._between
                return True
        return self._between()

    def _between(self) -> bool:
        at, marker = _first_marker(self._buffer, _HEADS)
        if marker is None:
            self._show_all_but_tag_start(*_HEADS)
            return False
        self._show_up_to(at)
        if marker == START:
            self._buffer = self._buffer[len(START):]
        self._step = self._in_header
        return True

    def _in_call(self) -> bool:
        at, marker = _first_marker(self._buffer)
        end = at if marker is not None else len(self._buffer) - (
            0 if self._ended else partial_tag_length(self._buffer, _MARKERS))
        if not self._arguments.raw:
            spaces = end - len(self._buffer[:end].lstrip(_JSON_SPACE))
            self._to_block(spaces)
            end -= spaces
            if end > 0 and self._buffer[0] != "{":
                return self._give_up_call()
        moved = self._arguments_then(self._buffer[:end], self._after_call)
        if moved is not None:
            return moved
        return marker is not None and self._give_up_call()

    def _after_call(self) -> bool:
        """What the call's message holds after its JSON: spaces belong to the frame, other text
        is content."""
        text = self._buffer.lstrip(_JSON_SPACE)
        self._buffer = text
        if not text:
            return False
        self._step = self._in_content
        return True


def _first_marker(text: str, markers: tuple[str, ...] = _MARKERS) -> tuple[int, str | None]:
    """Where the first of markers begins in text, and which; (-1, None) when none does."""
    found = [(text.find(m), m) for m in markers if m in text]
    return min(found) if found else (-1, None)
