"""Mistral tool calls, in both of its tokenizers' forms:
`[TOOL_CALLS][{"name": "f", "arguments": {...}}, ...]` (a JSON array after the tag), and the
newer `[TOOL_CALLS]f[ARGS]{...}`, each call with its own `[TOOL_CALLS]`.

A `[TOOL_CALLS]` that no valid call follows is content, from the tag to where the call broke;
so is text after the calls. Both tags are special tokens: the detokenizer must keep them."""

from __future__ import annotations

from pagoda.engine.parsers.call_streamer import CallStreamer
from pagoda.engine.parsers.json_call import CallObjectReader, JsonValueScanner
from pagoda.engine.parsers.tags import partial_tag_length
from pagoda.engine.parsers.tool_calls import ToolParser

_TOOL_CALLS = "[TOOL_CALLS]"
_ARGS = "[ARGS]"
_NAME_PUNCTUATION = "_-."


class MistralToolParser(ToolParser):
    name = "mistral"
    reads_special_tokens = True

    def _streamer(self, *, whole: bool) -> MistralStreamer:
        return MistralStreamer(whole=whole)


class MistralStreamer(CallStreamer):
    """States: content, after `[TOOL_CALLS]`; then an array's items and what follows each, or
    a function's name and its `[ARGS]` object."""

    def __init__(self, *, whole: bool = False,
                 argument_keys: tuple[str, ...] = ("arguments",)) -> None:
        super().__init__(whole=whole)
        self._step = self._in_content
        self._argument_keys = argument_keys
        self._reader = CallObjectReader(argument_keys)

    def _in_content(self) -> bool:
        at = self._buffer.find(_TOOL_CALLS)
        if at < 0:
            self._show_all_but_tag_start(_TOOL_CALLS)
            return False
        self._show_up_to(at)
        self._to_block(len(_TOOL_CALLS))
        self._step = self._after_tag
        return True

    def _after_tag(self) -> bool:
        text = self._buffer.lstrip()
        if not text:
            return self._ended and self._give_up_call()
        self._to_block(len(self._buffer) - len(text))
        if text.startswith("["):
            self._to_block(1)
            return self._start_item()
        self._name = ""
        self._step = self._in_name
        return True

    def _start_item(self) -> bool:
        self._reader = CallObjectReader(self._argument_keys)
        self._step = self._in_item
        return True

    def _in_item(self) -> bool:
        return self._read_call_then(self._after_item)

    def _after_item(self) -> bool:
        text = self._buffer.lstrip()
        self._buffer = text
        if text.startswith(","):
            self._buffer = text[1:]
            return self._start_item()
        if text.startswith("]"):
            self._buffer = text[1:]
        elif not text:
            return False
        self._step = self._in_content
        return True

    def _in_name(self) -> bool:
        at = self._buffer.find(_ARGS)
        end = at if at >= 0 else len(self._buffer) - (
            0 if self._ended else partial_tag_length(self._buffer, (_ARGS,)))
        bad = next((i for i, char in enumerate(self._buffer[:end]) if not _in_name(char)), None)
        if bad is not None:
            self._to_block(bad)
            return self._give_up_call()
        self._name += self._buffer[:end]
        self._to_block(end)
        if at < 0:
            return self._ended and self._give_up_call()
        if not self._name:
            return self._give_up_call()
        self._to_block(len(_ARGS))
        self._arguments = JsonValueScanner()
        self._step = self._in_arguments
        return True

    def _in_arguments(self) -> bool:
        if not self._arguments.raw and self._buffer[:1] not in ("", "{"):
            return self._give_up_call()
        return self._arguments_then(self._buffer, self._in_content) or False


def _in_name(char: str) -> bool:
    return char.isalnum() or char in _NAME_PUNCTUATION
