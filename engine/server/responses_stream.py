"""A response's output items, built from its reply's chat deltas (engine/parsers/replies.py's
ReplyStream: reasoning, content, tool calls), and the typed events that announce them as they
grow. The whole (non-streamed) response is built the same way, its events left unsent, so both
give the same items."""

from __future__ import annotations

from dataclasses import dataclass, field

from engine.server.generation import item_id

# Which output item each field of a chat delta grows.
_KINDS = (("reasoning_content", "reasoning"), ("content", "message"))


@dataclass(slots=True)
class _OpenItem:
    kind: str  # "reasoning", "message" or "function_call"
    output_index: int
    id: str
    text: str = ""  # the text, or a call's arguments
    call_index: int | None = None  # the call's index in the chat deltas
    call_id: str = ""
    name: str = ""


@dataclass(slots=True)
class ResponseEvents:
    """Output items and their events, in order; `sequence_number` counts every event."""

    items: list[dict] = field(default_factory=list)
    _open: _OpenItem | None = None
    _sequence: int = 0

    def event(self, type_: str, **fields) -> dict:
        event = {"type": type_, "sequence_number": self._sequence, **fields}
        self._sequence += 1
        return event

    def feed(self, delta: dict) -> list[dict]:
        """The events for one chat delta: items opened, grown and closed."""
        events: list[dict] = []
        for key, kind in _KINDS:
            if delta.get(key):
                events += self._grow_text(kind, delta[key])
        for call in delta.get("tool_calls", ()):
            events += self._grow_call(call)
        return events

    def finish(self, status: str) -> list[dict]:
        """Close the item still open: "completed", or "incomplete" when the reply was cut. An
        empty reply is an empty message, so there is always an item to read."""
        events = self._open_text("message") if not self.items and self._open is None else []
        return events + self._close(status)

    def _grow_text(self, kind: str, text: str) -> list[dict]:
        events = []
        if self._open is None or self._open.kind != kind:
            events += self._close("completed")
            events += self._open_text(kind)
        self._open.text += text
        events.append(self.event(_DELTA[kind], **self._where(), content_index=0, delta=text,
                                 **_LOGPROBS[kind]))
        return events

    def _grow_call(self, call: dict) -> list[dict]:
        events = []
        opened = self._open
        if opened is None or opened.kind != "function_call" or opened.call_index != call["index"]:
            events += self._close("completed")
            function = call["function"]
            self._open = _OpenItem("function_call", len(self.items), item_id("fc"),
                                   call_index=call["index"], call_id=call["id"],
                                   name=function["name"])
            events.append(self.event("response.output_item.added",
                                     output_index=self._open.output_index,
                                     item=self._item(self._open, "in_progress")))
        arguments = call["function"].get("arguments") or ""
        if arguments:
            self._open.text += arguments
            events.append(self.event("response.function_call_arguments.delta", **self._where(),
                                     delta=arguments))
        return events

    def _open_text(self, kind: str) -> list[dict]:
        self._open = _OpenItem(kind, len(self.items), item_id("msg" if kind == "message" else "rs"))
        where = self._where()
        return [self.event("response.output_item.added", output_index=where["output_index"],
                           item=self._item(self._open, "in_progress", parts=[])),
                self.event("response.content_part.added", **where, content_index=0,
                           part=_part(kind, ""))]

    def _close(self, status: str) -> list[dict]:
        opened, self._open = self._open, None
        if opened is None:
            return []
        where = {"item_id": opened.id, "output_index": opened.output_index}
        if opened.kind == "function_call":
            events = [self.event("response.function_call_arguments.done", **where,
                                 name=opened.name, arguments=opened.text)]
        else:
            part = _part(opened.kind, opened.text)
            events = [self.event(_DONE[opened.kind], **where, content_index=0, text=opened.text,
                                 **_LOGPROBS[opened.kind]),
                      self.event("response.content_part.done", **where, content_index=0,
                                 part=part)]
        item = self._item(opened, status)
        self.items.append(item)
        events.append(self.event("response.output_item.done", output_index=opened.output_index,
                                 item=item))
        return events

    def _where(self) -> dict:
        return {"item_id": self._open.id, "output_index": self._open.output_index}

    @staticmethod
    def _item(opened: _OpenItem, status: str, parts: list | None = None) -> dict:
        if opened.kind == "function_call":
            return {"id": opened.id, "type": "function_call", "status": status,
                    "call_id": opened.call_id, "name": opened.name, "arguments": opened.text}
        content = [_part(opened.kind, opened.text)] if parts is None else parts
        if opened.kind == "reasoning":
            return {"id": opened.id, "type": "reasoning", "status": status, "summary": [],
                    "content": content}
        return {"id": opened.id, "type": "message", "status": status, "role": "assistant",
                "content": content}


_DELTA = {"message": "response.output_text.delta", "reasoning": "response.reasoning_text.delta"}
_DONE = {"message": "response.output_text.done", "reasoning": "response.reasoning_text.done"}
# Text events carry the (here empty) logprobs; reasoning text events have none.
_LOGPROBS = {"message": {"logprobs": []}, "reasoning": {}}


def _part(kind: str, text: str) -> dict:
    if kind == "reasoning":
        return {"type": "reasoning_text", "text": text}
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}
