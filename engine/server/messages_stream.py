"""A message's content blocks, built from its reply's chat deltas (engine/parsers/replies.py's
ReplyStream: reasoning, content, tool calls), and Anthropic's events that announce them as they
grow (content_block_start, _delta, _stop). The whole (non-streamed) message is built the same
way, its events left unsent, so both give the same blocks."""

from __future__ import annotations

from dataclasses import dataclass, field

from engine.text import bounded_json

# Which block each text field of a chat delta grows, and the delta that grows it.
_KINDS = (("reasoning_content", "thinking", "thinking_delta"),
          ("content", "text", "text_delta"))
_TEXT_FIELD = {"thinking": "thinking", "text": "text"}


@dataclass(slots=True)
class _OpenBlock:
    kind: str  # "thinking", "text" or "tool_use"
    index: int
    text: str = ""  # the text, or a call's arguments (JSON)
    call_index: int | None = None  # the call's index in the chat deltas
    call_id: str = ""
    name: str = ""


@dataclass(slots=True)
class MessageBlocks:
    """Content blocks and their events, in order."""

    blocks: list[dict] = field(default_factory=list)
    _open: _OpenBlock | None = None

    @property
    def called(self) -> bool:
        return any(block["type"] == "tool_use" for block in self.blocks)

    def feed(self, delta: dict) -> list[dict]:
        """The events for one chat delta: blocks started, grown and stopped."""
        events: list[dict] = []
        for key, kind, delta_type in _KINDS:
            if delta.get(key):
                events += self._grow_text(kind, delta_type, delta[key])
        for call in delta.get("tool_calls", ()):
            events += self._grow_call(call)
        return events

    def finish(self) -> list[dict]:
        """Stop the block still open. An empty reply is an empty text block, so there is always
        a block to read."""
        if not self.blocks and self._open is None:
            return self._start(_OpenBlock("text", 0)) + self._stop()
        return self._stop()

    def _grow_text(self, kind: str, delta_type: str, text: str) -> list[dict]:
        events = []
        if self._open is None or self._open.kind != kind:
            events += self._stop()
            events += self._start(_OpenBlock(kind, len(self.blocks)))
        self._open.text += text
        events.append(_delta(self._open.index, {"type": delta_type, _TEXT_FIELD[kind]: text}))
        return events

    def _grow_call(self, call: dict) -> list[dict]:
        events = []
        opened = self._open
        if opened is None or opened.kind != "tool_use" or opened.call_index != call["index"]:
            events += self._stop()
            events += self._start(_OpenBlock("tool_use", len(self.blocks),
                                             call_index=call["index"], call_id=call["id"],
                                             name=call["function"]["name"]))
        arguments = call["function"].get("arguments") or ""
        if arguments:
            self._open.text += arguments
            events.append(_delta(self._open.index, {"type": "input_json_delta",
                                                    "partial_json": arguments}))
        return events

    def _start(self, opened: _OpenBlock) -> list[dict]:
        self._open = opened
        return [{"type": "content_block_start", "index": opened.index,
                 "content_block": _block(opened, started=True)}]

    def _stop(self) -> list[dict]:
        opened, self._open = self._open, None
        if opened is None:
            return []
        self.blocks.append(_block(opened, started=False))
        return [{"type": "content_block_stop", "index": opened.index}]


def _delta(index: int, delta: dict) -> dict:
    return {"type": "content_block_delta", "index": index, "delta": delta}


def _block(opened: _OpenBlock, started: bool) -> dict:
    """A block as its start event announces it (empty), or whole."""
    if opened.kind == "tool_use":
        return {"type": "tool_use", "id": opened.call_id, "name": opened.name,
                "input": {} if started else _input(opened.text)}
    if opened.kind == "thinking":
        # Anthropic signs its thinking so that it can check it when sent back; this server
        # reads none back (earlier thinking is left out of the prompt), so it signs nothing.
        return {"type": "thinking", "thinking": "" if started else opened.text, "signature": ""}
    return {"type": "text", "text": "" if started else opened.text}


def _input(arguments: str) -> dict:
    """A call's arguments as its input. The parsers pass only calls whose arguments are a JSON
    object, but a named tool's arguments cut by max_tokens are not whole: their input is empty
    then, and the stop_reason says why."""
    try:
        value = bounded_json.loads(arguments or "{}")
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}
