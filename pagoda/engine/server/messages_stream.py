"""A message's content blocks, built from its reply's chat deltas (pagoda/engine/parsers/replies.py's
ReplyStream: reasoning, content, tool calls), and Anthropic's events that announce them as they
grow (content_block_start, _delta, _stop). The whole (non-streamed) message is built the same
way, its events left unsent, so both give the same blocks."""

from __future__ import annotations

from dataclasses import dataclass, field

from pagoda.engine.server.reply_segments import GROW, OPEN, ReplySegments, Segment, Step
from pagoda.engine.text import bounded_json

# Which block each text field of a chat delta grows, and the delta that grows it.
_KINDS = (("reasoning_content", "thinking"), ("content", "text"))
_TEXT_DELTA = {"thinking": "thinking_delta", "text": "text_delta"}


@dataclass(slots=True)
class MessageBlocks:
    """Content blocks and their events, in order."""

    blocks: list[dict] = field(default_factory=list)
    _segments: ReplySegments = field(default_factory=lambda: ReplySegments(_KINDS, "tool_use"))

    @property
    def called(self) -> bool:
        return any(block["type"] == "tool_use" for block in self.blocks)

    def feed(self, delta: dict) -> list[dict]:
        """The events for one chat delta: blocks started, grown and stopped."""
        return [self._event(step) for step in self._segments.feed(delta)]

    def finish(self) -> list[dict]:
        """Stop the block still open. An empty reply is an empty text block, so there is always
        a block to read."""
        return [self._event(step) for step in self._segments.finish("text")]

    def _event(self, step: Step) -> dict:
        block = step.segment
        if step.what == OPEN:
            return {"type": "content_block_start", "index": block.index,
                    "content_block": _block(block, started=True)}
        if step.what == GROW:
            return _delta(block.index, _grown(block.kind, step.piece))
        self.blocks.append(_block(block, started=False))
        return {"type": "content_block_stop", "index": block.index}


def _grown(kind: str, piece: str) -> dict:
    if kind == "tool_use":
        return {"type": "input_json_delta", "partial_json": piece}
    return {"type": _TEXT_DELTA[kind], kind: piece}


def _delta(index: int, delta: dict) -> dict:
    return {"type": "content_block_delta", "index": index, "delta": delta}


def _block(opened: Segment, started: bool) -> dict:
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
