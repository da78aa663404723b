"""The reasoning a model writes between `<think>` and `</think>` before its answer (Qwen3,
QwQ, the DeepSeek-R1 distills), split from the answer, whole and streamed.

Some templates end the prompt with `<think>\\n`: the reply then begins inside the reasoning,
with no opening tag (`starts_in_reasoning`, see `prompt_opens_reasoning`). Otherwise only a start
tag at the very beginning of the reply (after whitespace) opens reasoning; a later one is
content. The reasoning is kept as written; the whitespace between `</think>` and the answer is
not part of the answer. A reply that stops before `</think>` is all reasoning."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from pagoda.engine.parsers.tags import partial_tag_length


@dataclass(frozen=True, slots=True)
class ReasoningParser:
    """The tags around a family's reasoning."""

    start: str = "<think>"
    end: str = "</think>"

    def split(self, text: str, *, starts_in_reasoning: bool) -> tuple[str | None, str]:
        """(reasoning, content) of a whole reply; reasoning is None when there was none."""
        if starts_in_reasoning:
            body = text
        else:
            stripped = text.lstrip()
            if not stripped.startswith(self.start):
                return None, text
            body = stripped[len(self.start):]
        reasoning, _, answer = body.partition(self.end)
        return reasoning, answer.lstrip()

    def streamer(self, starts_in_reasoning: bool) -> ReasoningStreamer:
        """A streamer for one reply."""
        return ReasoningStreamer(self, starts_in_reasoning)


class ReasoningStreamer:
    """Splits one streamed reply; joined, its deltas give what `split` gives (None as "")."""

    def __init__(self, parser: ReasoningParser, starts_in_reasoning: bool) -> None:
        self._parser = parser
        self._buffer = ""
        self._ended = False
        self._reasoning = ""
        self._content = ""
        self._step: Callable[[], bool] = (
            self._in_reasoning if starts_in_reasoning else self._at_start)

    def feed(self, delta_text: str) -> tuple[str, str]:
        """Reads delta_text; returns (reasoning, content) that can be shown now."""
        self._buffer += delta_text
        return self._advance()

    def finish(self) -> tuple[str, str]:
        """The reply has ended: returns (reasoning, content) held back until now."""
        self._ended = True
        return self._advance()

    def _advance(self) -> tuple[str, str]:
        while self._step():
            pass
        out = self._reasoning, self._content
        self._reasoning = self._content = ""
        return out

    def _at_start(self) -> bool:
        text = self._buffer.lstrip()
        if text.startswith(self._parser.start):
            self._buffer = text[len(self._parser.start):]
            self._step = self._in_reasoning
            return True
        if not self._ended and self._parser.start.startswith(text):
            return False
        self._step = self._in_content
        return True

    def _in_reasoning(self) -> bool:
        at = self._buffer.find(self._parser.end)
        if at < 0:
            keep = 0 if self._ended else partial_tag_length(self._buffer, (self._parser.end,))
            cut = len(self._buffer) - keep
            self._reasoning += self._buffer[:cut]
            self._buffer = self._buffer[cut:]
            return False
        self._reasoning += self._buffer[:at]
        self._buffer = self._buffer[at + len(self._parser.end):]
        self._step = self._after_reasoning
        return True

    def _after_reasoning(self) -> bool:
        self._buffer = self._buffer.lstrip()
        if not self._buffer:
            return False
        self._step = self._in_content
        return True

    def _in_content(self) -> bool:
        self._content += self._buffer
        self._buffer = ""
        return False


def reasoning_parser_for_template(chat_template: str) -> ReasoningParser | None:
    """A reasoning parser when the chat template knows `<think>` and `</think>`; else None."""
    parser = ReasoningParser()
    if parser.start in chat_template and parser.end in chat_template:
        return parser
    return None


def prompt_opens_reasoning(prompt_text: str, parser: ReasoningParser) -> bool:
    """Whether the rendered prompt ends (whitespace aside) with an open start tag, so the reply
    begins inside the reasoning."""
    return prompt_text.rstrip().endswith(parser.start)
