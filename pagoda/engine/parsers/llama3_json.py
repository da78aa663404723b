"""Llama 3.1, 3.2 and 3.3 JSON tool calls: the reply is `{"name": "f", "parameters": {...}}`
(or "arguments"), optionally after `<|python_tag|>`, several joined by `;`.

Only a reply that begins (after whitespace) with `{` or `<|python_tag|>` holds calls; any other
reply is content. A first object that is no valid call makes the whole reply content; text after
the calls (or from a later object that is no call) is content."""

from __future__ import annotations

from pagoda.engine.parsers.call_streamer import CallStreamer
from pagoda.engine.parsers.json_call import CallObjectReader
from pagoda.engine.parsers.tool_calls import ToolParser

_PYTHON_TAG = "<|python_tag|>"
_ARGUMENT_KEYS = ("parameters", "arguments")
_SEPARATOR = ";"


class Llama3JsonToolParser(ToolParser):
    name = "llama3_json"
    reads_special_tokens = True

    def _streamer(self, *, whole: bool) -> Llama3JsonStreamer:
        return Llama3JsonStreamer(whole=whole)


class Llama3JsonStreamer(CallStreamer):
    """States: the reply's start, a call's JSON, between calls, plain content to the end."""

    def __init__(self, *, whole: bool = False) -> None:
        super().__init__(whole=whole)
        self._step = self._at_start
        self._reader = CallObjectReader(_ARGUMENT_KEYS)

    def _at_start(self) -> bool:
        text = self._buffer.lstrip()
        spaces = len(self._buffer) - len(text)
        if text.startswith(_PYTHON_TAG):
            self._to_block(spaces + len(_PYTHON_TAG))
            return self._start_call()
        if text.startswith("{"):
            self._to_block(spaces)
            return self._start_call()
        if not self._ended and _PYTHON_TAG.startswith(text):
            return False
        self._step = self._in_plain
        return True

    def _start_call(self) -> bool:
        self._reader = CallObjectReader(_ARGUMENT_KEYS)
        self._step = self._in_call
        return True

    def _in_call(self) -> bool:
        return self._read_call_then(self._between_calls)

    def _give_up_call(self) -> bool:
        self._fail_call()
        self._step = self._in_plain
        return True

    def _between_calls(self) -> bool:
        text = self._buffer.lstrip()
        self._show_up_to(len(self._buffer) - len(text))
        if not text:
            return False
        if text.startswith(_SEPARATOR):
            self._buffer = text[len(_SEPARATOR):]
            return True
        if text.startswith("{"):
            return self._start_call()
        self._step = self._in_plain
        return True

    def _in_plain(self) -> bool:
        self._show_up_to(len(self._buffer))
        return False
