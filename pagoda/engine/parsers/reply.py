"""A reply's parts in order: reasoning first, then the answer, where tool calls are looked for
(never inside the reasoning)."""

from __future__ import annotations

from dataclasses import dataclass, field

from pagoda.engine.parsers.reasoning import ReasoningParser, ReasoningStreamer
from pagoda.engine.parsers.tool_calls import ToolCall, ToolCallDelta, ToolCallStreamer, ToolParser


@dataclass(slots=True)
class ReplyParts:
    """A whole reply: reasoning (None when there was none), content and tool calls, as
    `ParsedReply` defines them."""

    reasoning: str | None
    content: str | None
    tool_calls: list[ToolCall]


@dataclass(slots=True)
class ReplyDelta:
    """What one fed delta of text adds to each part."""

    reasoning: str = ""
    content: str = ""
    tool_calls: list[ToolCallDelta] = field(default_factory=list)


@dataclass(frozen=True, slots=True)
class ReplyParser:
    """The parsers a model's replies need: either may be None (no reasoning, no tools asked)."""

    reasoning: ReasoningParser | None = None
    tools: ToolParser | None = None

    @property
    def has_reasoning(self) -> bool:
        return self.reasoning is not None

    @property
    def reads_special_tokens(self) -> bool:
        """Whether the tool parser's tags are special tokens, which the text must keep."""
        return self.tools is not None and self.tools.reads_special_tokens

    def parse(self, text: str, *, starts_in_reasoning: bool = False) -> ReplyParts:
        """The parts of a whole reply; starts_in_reasoning: the prompt opened the reasoning."""
        self._check(starts_in_reasoning)
        reasoning, answer = (None, text) if self.reasoning is None else self.reasoning.split(
            text, starts_in_reasoning=starts_in_reasoning)
        if self.tools is None:
            return ReplyParts(reasoning, answer, [])
        parsed = self.tools.parse(answer)
        return ReplyParts(reasoning, parsed.content, parsed.tool_calls)

    def streamer(self, *, starts_in_reasoning: bool = False) -> ReplyStreamer:
        """A streamer for one reply."""
        self._check(starts_in_reasoning)
        return ReplyStreamer(
            None if self.reasoning is None else self.reasoning.streamer(starts_in_reasoning),
            None if self.tools is None else self.tools.streamer())

    def _check(self, starts_in_reasoning: bool) -> None:
        if starts_in_reasoning and self.reasoning is None:
            raise ValueError("starts_in_reasoning=True needs a reasoning parser: the reply would "
                             "begin inside reasoning nothing can split off")


class ReplyStreamer:
    """Feeds the reasoning streamer, and what it passes on as answer to the tool streamer."""

    def __init__(self, reasoning: ReasoningStreamer | None,
                 tools: ToolCallStreamer | None) -> None:
        self._reasoning = reasoning
        self._tools = tools

    def feed(self, delta_text: str) -> ReplyDelta:
        reasoning, answer = ("", delta_text) if self._reasoning is None else self._reasoning.feed(
            delta_text)
        return self._with_tools(reasoning, answer, finish=False)

    def finish(self) -> ReplyDelta:
        reasoning, answer = ("", "") if self._reasoning is None else self._reasoning.finish()
        return self._with_tools(reasoning, answer, finish=True)

    def _with_tools(self, reasoning: str, answer: str, *, finish: bool) -> ReplyDelta:
        if self._tools is None:
            return ReplyDelta(reasoning, answer)
        delta = self._tools.feed(answer)
        if finish:
            last = self._tools.finish()
            delta.content += last.content
            delta.tool_calls += last.tool_calls
        return ReplyDelta(reasoning, delta.content, delta.tool_calls)
