"""Reads a tool call's JSON a character at a time: where a value ends, the function's name, and
the arguments' text exactly as the model wrote it.

A streamer needs these before the object has closed (to stream the arguments as they arrive),
so the readers track strings, escapes and nesting themselves; whether the text is valid JSON is
left to `json` once it is complete."""

from __future__ import annotations

from collections.abc import Callable

from pagoda.engine.text import bounded_json

_JSON_SPACE = " \t\r\n"
_VALUE_STARTS = '{["-0123456789tfn'
_SCALAR_ENDS = _JSON_SPACE + ",]}"
_CLOSER = {"{": "}", "[": "]"}


class JsonValueScanner:
    """Finds where one JSON value ends without parsing it; `raw` is its text so far.

    `broken` is set at a character no JSON value could continue with (a closer that does not
    match, a value that cannot start so); that character is not consumed."""

    __slots__ = (
        "_closers",
        "_escaped",
        "_in_string",
        "_scalar",
        "_started",
        "broken",
        "done",
        "raw",
    )

    def __init__(self) -> None:
        self.raw = ""
        self.done = False
        self.broken = False
        self._started = False
        self._closers: list[str] = []
        self._in_string = False
        self._escaped = False
        self._scalar = False

    def consume(self, text: str, pos: int = 0) -> int:
        """Reads text[pos:] up to the value's end; returns the position it stopped at."""
        start = pos
        while pos < len(text) and not (self.done or self.broken):
            if self._takes(text[pos]):
                pos += 1
        self.raw += text[start:pos]
        return pos

    def _takes(self, char: str) -> bool:
        if self._in_string:
            self._read_string(char)
            return True
        if self._scalar:
            # A number or a literal ends at the first character that is not part of it.
            self.done = char in _SCALAR_ENDS
            return not self.done
        if not self._started:
            self._started = True
            if char not in _VALUE_STARTS:
                return self._break()
        return self._read_structure(char)

    def _read_string(self, char: str) -> None:
        if self._escaped:
            self._escaped = False
        elif char == "\\":
            self._escaped = True
        elif char == '"':
            self._in_string = False
            self.done = not self._closers

    def _read_structure(self, char: str) -> bool:
        if char == '"':
            self._in_string = True
        elif char in _CLOSER:
            self._closers.append(_CLOSER[char])
        elif char in "}]":
            if not self._closers or char != self._closers[-1]:
                return self._break()
            self._closers.pop()
            self.done = not self._closers
        elif not self._closers:
            self._scalar = True
        return True

    def _break(self) -> bool:
        self.broken = True
        return False


class CallObjectReader:
    """Reads `{"name": "f", "<arguments key>": {...}}` a character at a time.

    Other keys are read and ignored. `done` once the object closed; `broken` at a character that
    cannot continue a call object (not consumed): not an object, a name that is not a non-empty
    string, a key given twice, both argument keys."""

    def __init__(self, argument_keys: tuple[str, ...] = ("arguments",)) -> None:
        self.raw = ""
        self.name: str | None = None
        self.done = False
        self.broken = False
        self._argument_keys = argument_keys
        self._expect: Callable[[str], bool] = self._open
        self._value: JsonValueScanner | None = None
        self._reading_key = False
        self._key = ""
        self._keys: set[str] = set()
        self._arguments: JsonValueScanner | None = None
        self._streams = False

    def consume(self, text: str, pos: int = 0) -> int:
        """Reads text[pos:] up to the object's end; returns the position it stopped at."""
        start = pos
        while pos < len(text) and not (self.done or self.broken):
            if self._value is None:
                pos += self._expect(text[pos])
                continue
            pos = self._value.consume(text, pos)
            if self._value.broken:
                self.broken = True
            elif self._value.done:
                self._end_value()
        self.raw += text[start:pos]
        return pos

    @property
    def streamed_arguments(self) -> str | None:
        """The arguments' text so far, when it can stream: an object begun after the name was
        known. None otherwise: a string holding JSON, or arguments before the name, wait."""
        if not self._streams:
            return None
        assert self._arguments is not None
        return self._arguments.raw

    def call(self) -> tuple[str, str] | None:
        """(name, arguments as an object's JSON text) of a closed, valid call; else None."""
        if not self.done or self.name is None:
            return None
        try:
            bounded_json.loads(self.raw)
        except ValueError:
            return None
        arguments = object_arguments(None if self._arguments is None else self._arguments.raw)
        return None if arguments is None else (self.name, arguments)

    def _open(self, char: str) -> bool:
        if char == "{":
            self._expect = self._first_key
        return char in _JSON_SPACE or char == "{" or self._break()

    def _first_key(self, char: str) -> bool:
        if char == "}":
            return self._close()
        return self._key_start(char)

    def _key_start(self, char: str) -> bool:
        if char in _JSON_SPACE:
            return True
        if char != '"':
            return self._break()
        self._reading_key = True
        self._value = JsonValueScanner()
        return False

    def _colon(self, char: str) -> bool:
        if char == ":":
            self._expect = self._value_start
        return char in _JSON_SPACE or char == ":" or self._break()

    def _value_start(self, char: str) -> bool:
        if char in _JSON_SPACE:
            return True
        if self._key == "name" and char != '"':
            return self._break()
        self._value = JsonValueScanner()
        if self._key in self._argument_keys:
            self._arguments = self._value
            self._streams = self.name is not None and char == "{"
        return False

    def _after_value(self, char: str) -> bool:
        if char == ",":
            self._expect = self._key_start
        elif char == "}":
            return self._close()
        return char in _JSON_SPACE or char == "," or self._break()

    def _end_value(self) -> None:
        value, self._value = self._value, None
        assert value is not None
        if self._reading_key:
            self._reading_key = False
            self._end_key(value.raw)
        elif self._key == "name":
            self.name = _decoded_string(value.raw) or None
            self.broken = self.name is None
            self._expect = self._after_value
        else:
            self._expect = self._after_value

    def _end_key(self, raw: str) -> None:
        key = _decoded_string(raw)
        second_name = key == "name" and key in self._keys
        second_arguments = key in self._argument_keys and self._arguments is not None
        if key is None or second_name or second_arguments:
            self.broken = True
            return
        self._key = key
        self._keys.add(key)
        self._expect = self._colon

    def _close(self) -> bool:
        self.done = True
        return True

    def _break(self) -> bool:
        self.broken = True
        return False


def object_arguments(raw: str | None) -> str | None:
    """Arguments as the JSON text of an object: as written when they are an object, decoded when
    the model wrote them as a string holding an object, "{}" when absent or null; None when
    they are anything else."""
    if raw is None or raw.strip() == "null":
        return "{}"
    try:
        value = bounded_json.loads(raw)
        if isinstance(value, str):
            return value if isinstance(bounded_json.loads(value), dict) else None
    except ValueError:
        return None
    return raw if isinstance(value, dict) else None


def _decoded_string(raw: str) -> str | None:
    try:
        value = bounded_json.loads(raw)
    except ValueError:
        return None
    return value if isinstance(value, str) else None
