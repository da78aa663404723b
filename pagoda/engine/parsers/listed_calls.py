"""A reply that is nothing but a JSON list of calls, `[{"name": "f", "parameters": {...}}]`:
what tool_choice "required" constrains a reply to (pagoda/engine/parsers/tool_use.py). Read as
Mistral's array form is, from its first character, so the calls stream as they are written."""

from __future__ import annotations

from pagoda.engine.parsers.mistral import MistralStreamer
from pagoda.engine.parsers.tool_calls import ToolParser


class ListedCallsParser(ToolParser):
    name = "listed_calls"

    def _streamer(self, *, whole: bool) -> ListedCallsStreamer:
        return ListedCallsStreamer(whole=whole)


class ListedCallsStreamer(MistralStreamer):
    def __init__(self, *, whole: bool = False) -> None:
        super().__init__(whole=whole, argument_keys=("parameters",))
        self._step = self._after_tag
