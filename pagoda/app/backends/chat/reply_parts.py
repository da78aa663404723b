"""A reply put together from OpenAI's chat deltas ({"content", "reasoning_content",
"tool_calls"}), as both backends read them: a server's chunks, and the engine's reply in this
process as the server's own parsers shape it. So a ReplyChunk means the same from either.

A server that does not split reasoning from the answer sends it as `<think>…</think>` at the
start of the content: that is read as reasoning too (the engine's reasoning parser).

Tool calls come by index: the first delta of a call brings its id and name, the next ones its
arguments in pieces (vLLM, SGLang, Pagoda), or one delta brings the whole call (Ollama). Without
an index, a delta with a new id starts a call and one without continues the last.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

from pagoda.app.backends.types import FinishReason, ReplyChunk, ToolCallRecord
from pagoda.engine.parsers.reasoning import ReasoningParser


class MalformedDeltaError(ValueError):
    """A delta that is not in OpenAI's shape; its message says what was wrong, to quote."""


@dataclass(slots=True, frozen=True)
class Step:
    """What one delta added to the answer and to the reasoning."""

    content: str = ""
    reasoning: str = ""


NOTHING = Step()


@dataclass(slots=True)
class _Call:
    id: str
    name: str
    arguments: list[str] = field(default_factory=list)

    def record(self) -> ToolCallRecord:
        return ToolCallRecord(self.id, self.name, "".join(self.arguments))


class ReplyParts:
    """The answer (`text`), the reasoning and the tool calls so far."""

    def __init__(self) -> None:
        self.text = ""
        self.reasoning = ""
        self._think = ReasoningParser().streamer(starts_in_reasoning=False)
        self._calls: dict[int, _Call] = {}
        self._last_index: int | None = None

    @property
    def called(self) -> bool:
        return bool(self._calls)

    def add(self, delta: object) -> Step | None:
        """Take one delta; what it added to the text and reasoning, None when it brought
        nothing at all (a role alone, an empty content). A piece of a call is a Step of
        nothing."""
        if not isinstance(delta, dict):
            raise MalformedDeltaError("a delta that is not an object")
        content = _text(delta, "content")
        # vLLM, DeepSeek, llama.cpp and Pagoda say reasoning_content, Ollama and newer vLLM
        # reasoning; a server in between sends both, the same text.
        reasoning = _text(delta, "reasoning_content") or _text(delta, "reasoning")
        if content:
            thought, content = self._think.feed(content)
            reasoning += thought
        called = self._add_calls(delta.get("tool_calls"))
        self.text += content
        self.reasoning += reasoning
        if not (content or reasoning or called):
            return None
        return Step(content, reasoning)

    def chunk(self, step: Step = NOTHING, finish_reason: FinishReason | None = None,
              **counts) -> ReplyChunk:
        """The ReplyChunk for a step; with a finish reason the last one, with every call and
        `counts` (ReplyChunk's counts and timings). A reply that stopped by itself after
        calling tools finished with "tool_calls"."""
        if finish_reason == "stop" and self.called:
            finish_reason = "tool_calls"
        finished = finish_reason is not None
        if finished:  # text held back as a possible `<think>` tag is what it is
            thought, held = self._think.finish()
            self.text += held
            self.reasoning += thought
            step = Step(step.content + held, step.reasoning + thought)
        return ReplyChunk(step.content, self.text, finish_reason, delta_reasoning=step.reasoning,
                          reasoning=self.reasoning, tool_calls=self.tool_calls(finished),
                          **counts)

    def tool_calls(self, finished: bool) -> tuple[ToolCallRecord, ...]:
        """The calls whose arguments are complete: before the end, all but the one being
        written (the last begun)."""
        indexes = sorted(self._calls)
        if not finished and indexes:
            indexes.pop()
        return tuple(self._calls[i].record() for i in indexes)

    def _add_calls(self, pieces: object) -> bool:
        if pieces is None:
            return False
        if not isinstance(pieces, list) or not all(isinstance(p, dict) for p in pieces):
            raise MalformedDeltaError("tool_calls that are not a list of objects")
        for piece in pieces:
            self._add_piece(piece)
        return bool(pieces)

    def _add_piece(self, piece: dict) -> None:
        index = self._index_of(piece)
        function = piece.get("function") or {}
        if not isinstance(function, dict):
            raise MalformedDeltaError(f"tool call {index} whose function is not an object")
        call = self._calls.get(index)
        name = function.get("name")
        if call is None:
            call = self._calls[index] = _Call(_string(piece.get("id"), "id", index)
                                              or f"call_{index}", _string(name, "name", index))
        elif name and call.name != name:
            if call.name:
                raise MalformedDeltaError(f"tool call {index} renamed from {call.name!r} to "
                                          f"{name!r}")
            call.name = _string(name, "name", index)
        self._last_index = index
        call.arguments.append(_arguments(function.get("arguments"), index))

    def _index_of(self, piece: dict) -> int:
        index = piece.get("index")
        if index is None:
            given_id = piece.get("id")
            last = self._calls.get(self._last_index) if self._last_index is not None else None
            if last is None or (given_id and given_id != last.id):
                return len(self._calls)
            return self._last_index
        if not isinstance(index, int) or isinstance(index, bool) or index < 0:
            raise MalformedDeltaError(f"a tool call whose index is {index!r}")
        return index


def _text(delta: dict, key: str) -> str:
    value = delta.get(key)
    if value is None:
        return ""
    if not isinstance(value, str):
        raise MalformedDeltaError(f"a delta whose {key} is not text")
    return value


def _string(value: object, what: str, index: int) -> str:
    if value is None:
        return ""
    if not isinstance(value, str):
        raise MalformedDeltaError(f"tool call {index} whose {what} is not text")
    return value


def _arguments(value: object, index: int) -> str:
    """A piece of a call's arguments: JSON text, or (Ollama) the whole object."""
    if value is None:
        return ""
    if isinstance(value, dict):
        return json.dumps(value, ensure_ascii=False)
    if not isinstance(value, str):
        raise MalformedDeltaError(f"tool call {index} whose arguments are neither text nor "
                                  "an object")
    return value
