"""Hermes-style tool calls (Hermes 2 Pro and 3, Qwen2.5, Qwen3): content, then calls written as
`<tool_call>\\n{"name": "f", "arguments": {...}}\\n</tool_call>`, one after another.

A `<tool_call>` block that is no valid call is content from its tag through the next
`</tool_call>` (or up to the next `<tool_call>`). A last call whose closing tag never came
(the reply stopped right after its JSON) still counts."""

from __future__ import annotations

import logging

from pagoda.engine.parsers.call_streamer import CallStreamer
from pagoda.engine.parsers.json_call import CallObjectReader
from pagoda.engine.parsers.tool_calls import ToolParser

logger = logging.getLogger(__name__)

_OPEN = "<tool_call>"
_CLOSE = "</tool_call>"


class HermesToolParser(ToolParser):
    name = "hermes"

    def _streamer(self, *, whole: bool) -> HermesStreamer:
        return HermesStreamer(whole=whole)


class HermesStreamer(CallStreamer):
    """States: content, a call's JSON, after it (waiting for `</tool_call>`), a bad block."""

    def __init__(self, *, whole: bool = False) -> None:
        super().__init__(whole=whole)
        self._step = self._in_content
        self._reader = CallObjectReader()
        # Reading a whole reply: the valid call waiting for its closing tag to count.
        self._call: tuple[str, str] | None = None

    def _in_content(self) -> bool:
        at = self._buffer.find(_OPEN)
        if at < 0:
            self._show_all_but_tag_start(_OPEN)
            return False
        self._show_up_to(at)
        self._to_block(len(_OPEN))
        self._reader = CallObjectReader()
        self._step = self._in_call
        return True

    def _in_call(self) -> bool:
        self._read_call(self._reader)
        if self._reader.broken:
            return self._to_bad_block()
        if not self._reader.done:
            return False
        call = self._reader.call()
        if call is None and self._streamed is None:
            return self._to_bad_block()
        if self._whole:
            self._call = call  # it counts once its closing tag proves the block well formed
        else:
            self._end_call(call)
        self._step = self._after_call
        return True

    def _after_call(self) -> bool:
        text = self._buffer.lstrip()
        spaces = len(self._buffer) - len(text)
        if text.startswith(_CLOSE):
            self._to_block(spaces + len(_CLOSE))
            return self._close_call()
        if self._ended and not text:
            self._to_block(spaces)
            return self._close_call()
        if not self._ended and _CLOSE.startswith(text):
            return False
        self._to_block(spaces)
        if not self._whole:
            logger.warning("tool call %d went out, but text follows its JSON before %s; that text "
                           "is content", self._num_calls - 1, _CLOSE)
        return self._to_bad_block()

    def _close_call(self) -> bool:
        if self._whole:
            self._end_call(self._call)
        self._call = None
        self._block = ""
        self._step = self._in_content
        return True

    def _to_bad_block(self) -> bool:
        self._call = None
        self._fail_call()
        self._step = self._in_bad_block
        return True

    def _in_bad_block(self) -> bool:
        close, opening = self._buffer.find(_CLOSE), self._buffer.find(_OPEN)
        if close >= 0 and (opening < 0 or close < opening):
            self._show_up_to(close + len(_CLOSE))
        elif opening >= 0:
            self._show_up_to(opening)
        else:
            self._show_all_but_tag_start(_OPEN, _CLOSE)
            return False
        self._step = self._in_content
        return True
