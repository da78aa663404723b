"""A reply's chat deltas (pagoda/engine/parsers/replies.py's ReplyStream: reasoning, content, tool
calls) cut into segments, in order: a run of one text field, or one tool call. The Responses
API makes each an output item and the Messages API a content block; both announce a segment's
opening, growth and closing with events of their own (responses_stream.py, messages_stream.py),
and both build a whole reply the same way, its events left unsent."""

from __future__ import annotations

from dataclasses import dataclass

OPEN, GROW, CLOSE = "open", "grow", "close"


@dataclass(slots=True)
class Segment:
    kind: str  # one of the caller's text kinds, or its call kind
    index: int  # its place among the reply's segments
    text: str = ""  # the text, or a call's arguments (JSON)
    call_index: int | None = None  # the call's index in the chat deltas
    call_id: str = ""
    name: str = ""
    id: str = ""  # the caller's id for it, set when it opens


@dataclass(slots=True, frozen=True)
class Step:
    what: str  # OPEN, GROW or CLOSE
    segment: Segment
    piece: str = ""  # GROW: what was added to segment.text


class ReplySegments:
    """text_kinds: (chat delta field, segment kind) pairs; call_kind: a tool call's kind."""

    def __init__(self, text_kinds: tuple[tuple[str, str], ...], call_kind: str) -> None:
        self._text_kinds = text_kinds
        self._call_kind = call_kind
        self._open: Segment | None = None
        self._count = 0

    def feed(self, delta: dict) -> list[Step]:
        """The steps one chat delta takes: segments closed, opened and grown."""
        steps: list[Step] = []
        for key, kind in self._text_kinds:
            if delta.get(key):
                if self._open is None or self._open.kind != kind:
                    steps += self._close() + [self._start(Segment(kind, self._count))]
                steps.append(self._grow(delta[key]))
        for call in delta.get("tool_calls", ()):
            steps += self._grow_call(call)
        return steps

    def finish(self, empty_kind: str) -> list[Step]:
        """Close the segment still open. An empty reply is one empty segment of empty_kind, so
        there is always one to read."""
        if self._count == 0:
            return [self._start(Segment(empty_kind, 0))] + self._close()
        return self._close()

    def _grow_call(self, call: dict) -> list[Step]:
        steps = []
        opened = self._open
        if opened is None or opened.kind != self._call_kind or opened.call_index != call["index"]:
            steps += self._close()
            steps.append(self._start(Segment(self._call_kind, self._count,
                                             call_index=call["index"], call_id=call["id"],
                                             name=call["function"]["name"])))
        arguments = call["function"].get("arguments") or ""
        if arguments:
            steps.append(self._grow(arguments))
        return steps

    def _start(self, segment: Segment) -> Step:
        self._open = segment
        self._count += 1
        return Step(OPEN, segment)

    def _grow(self, piece: str) -> Step:
        self._open.text += piece
        return Step(GROW, self._open, piece)

    def _close(self) -> list[Step]:
        opened, self._open = self._open, None
        return [] if opened is None else [Step(CLOSE, opened)]
