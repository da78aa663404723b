"""A response's output items, built from its reply's chat deltas (pagoda/engine/parsers/replies.py's
ReplyStream: reasoning, content, tool calls), and the typed events that announce them as they
grow. The whole (non-streamed) response is built the same way, its events left unsent, so both
give the same items."""

from __future__ import annotations

from dataclasses import dataclass, field

from pagoda.engine.server.generation import item_id
from pagoda.engine.server.reply_segments import GROW, OPEN, ReplySegments, Segment, Step

# Which output item each field of a chat delta grows.
_KINDS = (("reasoning_content", "reasoning"), ("content", "message"))


@dataclass(slots=True)
class ResponseEvents:
    """Output items and their events, in order; `sequence_number` counts every event."""

    items: list[dict] = field(default_factory=list)
    _segments: ReplySegments = field(
        default_factory=lambda: ReplySegments(_KINDS, "function_call"))
    _sequence: int = 0

    def event(self, type_: str, **fields) -> dict:
        event = {"type": type_, "sequence_number": self._sequence, **fields}
        self._sequence += 1
        return event

    def feed(self, delta: dict) -> list[dict]:
        """The events for one chat delta: items opened, grown and closed."""
        return self._events(self._segments.feed(delta), "completed")

    def finish(self, status: str) -> list[dict]:
        """Close the item still open: "completed", or "incomplete" when the reply was cut. An
        empty reply is an empty message, so there is always an item to read."""
        return self._events(self._segments.finish("message"), status)

    def _events(self, steps: list[Step], status: str) -> list[dict]:
        """Each step's events; an item closed takes `status`."""
        events = []
        for step in steps:
            if step.what == OPEN:
                events += self._opened(step.segment)
            elif step.what == GROW:
                events.append(self._grown(step.segment, step.piece))
            else:
                events += self._closed(step.segment, status)
        return events

    def _opened(self, item: Segment) -> list[dict]:
        prefix = {"function_call": "fc", "message": "msg"}.get(item.kind, "rs")
        item.id = item_id(prefix)
        if item.kind == "function_call":
            return [self.event("response.output_item.added", output_index=item.index,
                               item=_item(item, "in_progress"))]
        return [self.event("response.output_item.added", output_index=item.index,
                           item=_item(item, "in_progress", parts=[])),
                self.event("response.content_part.added", **_where(item), content_index=0,
                           part=_part(item.kind, ""))]

    def _grown(self, item: Segment, piece: str) -> dict:
        if item.kind == "function_call":
            return self.event("response.function_call_arguments.delta", **_where(item),
                              delta=piece)
        return self.event(_DELTA[item.kind], **_where(item), content_index=0, delta=piece,
                          **_LOGPROBS[item.kind])

    def _closed(self, item: Segment, status: str) -> list[dict]:
        where = _where(item)
        if item.kind == "function_call":
            events = [self.event("response.function_call_arguments.done", **where,
                                 name=item.name, arguments=item.text)]
        else:
            events = [self.event(_DONE[item.kind], **where, content_index=0, text=item.text,
                                 **_LOGPROBS[item.kind]),
                      self.event("response.content_part.done", **where, content_index=0,
                                 part=_part(item.kind, item.text))]
        whole = _item(item, status)
        self.items.append(whole)
        events.append(self.event("response.output_item.done", output_index=item.index,
                                 item=whole))
        return events


def _where(item: Segment) -> dict:
    return {"item_id": item.id, "output_index": item.index}


def _item(item: Segment, status: str, parts: list | None = None) -> dict:
    if item.kind == "function_call":
        return {"id": item.id, "type": "function_call", "status": status,
                "call_id": item.call_id, "name": item.name, "arguments": item.text}
    content = [_part(item.kind, item.text)] if parts is None else parts
    if item.kind == "reasoning":
        return {"id": item.id, "type": "reasoning", "status": status, "summary": [],
                "content": content}
    return {"id": item.id, "type": "message", "status": status, "role": "assistant",
            "content": content}


_DELTA = {"message": "response.output_text.delta", "reasoning": "response.reasoning_text.delta"}
_DONE = {"message": "response.output_text.done", "reasoning": "response.reasoning_text.done"}
# Text events carry the (here empty) logprobs; reasoning text events have none.
_LOGPROBS = {"message": {"logprobs": []}, "reasoning": {}}


def _part(kind: str, text: str) -> dict:
    if kind == "reasoning":
        return {"type": "reasoning_text", "text": text}
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}
