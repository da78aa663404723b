"""What every family's tool-call streamer shares: the text not read yet, content shown as soon as
it cannot begin a tag, and calls numbered and streamed as their JSON arrives.

A family writes its syntax as states: `_step` is the state's method; it reads from the front of
`_buffer` and returns whether it moved on, or False when it needs more text. The same states
read a whole reply (`whole`, for `ToolParser.parse`) and a stream, so both agree by
construction, except where the stream committed to a call early (see `tool_calls`)."""

from __future__ import annotations

import logging
from collections.abc import Callable

from pagoda.engine.parsers.json_call import CallObjectReader, JsonValueScanner, object_arguments
from pagoda.engine.parsers.tags import partial_tag_length
from pagoda.engine.parsers.tool_calls import StreamDelta, ToolCallDelta, ToolCallStreamer, new_tool_call_id

logger = logging.getLogger(__name__)


class CallStreamer(ToolCallStreamer):
    """The shared bookkeeping; a family sets `_step` (its content state is `_in_content`) and
    calls the helpers below.

    `_block` is the text of the call being read: shown as content if it turns out no call.
    Whitespace is held while nothing else was shown, so that a reply of calls alone has no
    content; it is shown at the end if no call came."""

    def __init__(self, *, whole: bool = False) -> None:
        self._whole = whole
        self._step: Callable[[], bool]
        self._buffer = ""
        self._ended = False
        self._out = StreamDelta()
        self._held_space = ""
        self._shown_text = False
        self._num_calls = 0
        self._block = ""
        # How much of the current call's arguments went out; None while it has not been named.
        self._streamed: int | None = None
        # A call whose name came before its arguments (`_arguments_then`).
        self._name = ""
        self._arguments = JsonValueScanner()

    def feed(self, delta_text: str) -> StreamDelta:
        self._buffer += delta_text
        self._advance()
        return self._take()

    def finish(self) -> StreamDelta:
        self._ended = True
        self._advance()
        if self._block or self._streamed is not None:
            self._fail_call()
        if self._num_calls == 0:
            self._out.content += self._held_space
        self._held_space = ""
        return self._take()

    def _advance(self) -> None:
        while self._step():
            pass

    def _take(self) -> StreamDelta:
        out, self._out = self._out, StreamDelta()
        return out

    def _show(self, text: str) -> None:
        """Shows text as content, holding it while it and all content before are whitespace."""
        if self._shown_text:
            self._out.content += text
            return
        self._held_space += text
        if self._held_space and not self._held_space.isspace():
            self._out.content += self._held_space
            self._held_space = ""
            self._shown_text = True

    def _show_all_but_tag_start(self, *tags: str) -> None:
        """Shows the buffer except an end that may begin one of tags (all of it once ended)."""
        keep = 0 if self._ended else partial_tag_length(self._buffer, tags)
        cut = len(self._buffer) - keep
        self._show(self._buffer[:cut])
        self._buffer = self._buffer[cut:]

    def _show_up_to(self, end: int) -> None:
        self._show(self._buffer[:end])
        self._buffer = self._buffer[end:]

    def _to_block(self, end: int) -> None:
        """Moves the buffer's first `end` characters into the call being read."""
        self._block += self._buffer[:end]
        self._buffer = self._buffer[end:]

    def _read_call(self, reader: CallObjectReader) -> None:
        """Feeds the buffer to reader and streams the call once its name and arguments can go."""
        self._to_block(reader.consume(self._buffer))
        if not self._whole:
            self._stream_arguments(reader.name, reader.streamed_arguments)

    def _read_call_then(self, after) -> bool:
        """Read the call object under way; once it is whole and valid go on with `after`, and
        give it up (`_give_up_call`) once it cannot be."""
        self._read_call(self._reader)
        if self._reader.broken:
            return self._give_up_call()
        if not self._reader.done:
            return False
        if not self._end_call(self._reader.call()):
            return self._give_up_call()
        self._step = after
        return True

    def _arguments_then(self, text: str, after: Callable[[], bool]) -> bool | None:
        """Reads text (the buffer's front) into the arguments of the call `_name` (`_arguments`,
        an object), streaming them as they come; once they close, ends the call and goes on
        with `after`, or gives the call up where they are no object. True once it moved on,
        None while the arguments are still open."""
        self._to_block(self._arguments.consume(text))
        if not self._whole and self._arguments.raw:
            self._stream_arguments(self._name, self._arguments.raw)
        if self._arguments.broken:
            return self._give_up_call()
        if not self._arguments.done:
            return None
        arguments = object_arguments(self._arguments.raw)
        if not self._end_call(None if arguments is None else (self._name, arguments)):
            return self._give_up_call()
        self._step = after
        return True

    def _give_up_call(self) -> bool:
        """The call being read is none: its text is content, and content is read on."""
        self._fail_call()
        self._step = self._in_content
        return True

    def _stream_arguments(self, name: str | None, arguments: str | None) -> None:
        """Names the call when its arguments have begun, then passes on their new text."""
        if arguments is None:
            return
        if self._streamed is None:
            assert name is not None
            self._name_call(name, arguments)
        elif len(arguments) > self._streamed:
            self._add_arguments(arguments[self._streamed:])
        self._streamed = len(arguments)

    def _end_call(self, call: tuple[str, str] | None) -> bool:
        """The call's text is complete: emits what did not stream. False (and nothing changed)
        when it is no valid call and nothing of it went out: the caller shows it as content."""
        if call is None and self._streamed is None:
            return False
        if self._streamed is None:
            assert call is not None
            self._name_call(*call)
        elif call is None:
            logger.warning("tool call %d went out while streaming, but its JSON is invalid; its "
                           "arguments stay as the model wrote them", self._num_calls - 1)
        self._streamed = None
        self._block = ""
        return True

    def _fail_call(self) -> None:
        """The call being read is no call: its text is content, unless it already went out."""
        if self._streamed is None:
            self._show(self._block)
        else:
            logger.warning("tool call %d went out while streaming, but its text broke off or "
                           "ended before its JSON closed; its arguments stay as streamed",
                           self._num_calls - 1)
        self._block = ""
        self._streamed = None

    def _name_call(self, name: str, arguments: str) -> None:
        self._out.tool_calls.append(
            ToolCallDelta(self._num_calls, new_tool_call_id(), name, arguments))
        self._num_calls += 1

    def _add_arguments(self, fragment: str) -> None:
        self._out.tool_calls.append(ToolCallDelta(self._num_calls - 1, None, None, fragment))
