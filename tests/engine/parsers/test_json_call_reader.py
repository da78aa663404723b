"""The call reader finds where a call's JSON ends and what it names before the JSON is valid
text, without being fooled by strings."""

from __future__ import annotations

import pytest

from pagoda.engine.parsers.json_call import CallObjectReader, JsonValueScanner, object_arguments
from tests.engine.parsers.recorded_replies import TRICKY


def read(text: str, argument_keys: tuple[str, ...] = ("arguments",)) -> tuple[CallObjectReader, int]:
    reader = CallObjectReader(argument_keys)
    return reader, reader.consume(text)


def test_object_ends_at_its_own_closing_brace_not_at_braces_in_strings():
    call = f'{{"name": "write_file", "arguments": {TRICKY}}}'
    reader, end = read(call + "\n</tool_call>")
    assert (reader.done, end) == (True, len(call))
    assert reader.call() == ("write_file", TRICKY)


def test_name_is_known_and_arguments_stream_before_the_object_closes():
    reader, _ = read('{"name": "get_weather", "arguments": {"city": "Pa')
    assert (reader.done, reader.name, reader.streamed_arguments) == (
        False, "get_weather", '{"city": "Pa')


def test_arguments_before_the_name_wait_but_still_make_a_call():
    reader, _ = read('{"arguments": {"a": 1}, "name": "f"}')
    assert reader.streamed_arguments is None
    assert reader.call() == ("f", '{"a": 1}')


def test_other_keys_are_read_past():
    reader, _ = read('{"type": "function", "name": "f", "id": [1, {"x": "}"}], '
                     '"parameters": {}}', ("parameters", "arguments"))
    assert reader.call() == ("f", "{}")


@pytest.mark.parametrize(("text", "stop"), [
    ('{"name": 5}', 9),
    ('{"name": "a", "name": "b"}', 20),
    ('{"name": "f", "arguments": {}, "parameters": {}}', 43),
    ('{"name": "f", "arguments": [1}', 29),
    ('{"name" "f"}', 8),
    ("get_weather()", 0),
])
def test_reader_breaks_where_no_call_object_could_continue(text, stop):
    reader = CallObjectReader(("arguments", "parameters"))
    assert (reader.consume(text), reader.broken) == (stop, True)


@pytest.mark.parametrize("text", [
    '{"name": "f", "arguments": {"a": tru}}',
    '{"name": "f", "arguments": {}, "id": nul}',
])
def test_closed_object_that_is_invalid_json_is_no_call(text):
    reader, _ = read(text)
    assert reader.done
    assert reader.call() is None


@pytest.mark.parametrize(("raw", "arguments"), [
    (None, "{}"),
    ("null", "{}"),
    ('{"a": [1, 2]}', '{"a": [1, 2]}'),
    ('"{\\"a\\": 1}"', '{"a": 1}'),
    ('"[1]"', None),
    ("[1]", None),
    ('"not json"', None),
])
def test_arguments_become_the_json_text_of_an_object(raw, arguments):
    assert object_arguments(raw) == arguments


def test_scanner_ends_a_number_at_the_character_after_it():
    scanner = JsonValueScanner()
    assert scanner.consume("12.5e3 , next") == 6
    assert (scanner.done, scanner.raw) == (True, "12.5e3")
