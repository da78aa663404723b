"""Llama 3.x JSON replies: a reply that begins with `{` or <|python_tag|> holds calls joined by
`;`; any other reply is content."""

from __future__ import annotations

import pytest

from pagoda.engine.parsers.llama3_json import Llama3JsonToolParser
from tests.engine.parsers.recorded_replies import LLAMA3
from tests.engine.parsers.streaming import shape

parser = Llama3JsonToolParser()
WEATHER = '{"name": "get_weather", "parameters": {"city": "Paris"}}'


@pytest.mark.parametrize("name", LLAMA3)
def test_recorded_reply_parses_into_its_content_and_calls(name):
    recorded = LLAMA3[name]
    assert shape(parser.parse(recorded.text)) == (recorded.content, recorded.calls)


@pytest.mark.parametrize("text", [
    '<|python_tag|>brave_search.call(query="weather Paris")',
    '{"name": "get_weather", "parameters": {"city": Paris}}',
    '{"name": "get_weather", "parameters": {"city": "Paris"}, "arguments": {}}',
    '{"parameters": {"city": "Paris"}}',
])
def test_first_object_that_is_no_call_makes_the_whole_reply_content(text):
    assert shape(parser.parse(text)) == (text, [])


def test_text_after_the_calls_is_content():
    reply = parser.parse(f"{WEATHER}\n\nI asked for the weather.")
    assert shape(reply) == ("\n\nI asked for the weather.", [("get_weather", '{"city": "Paris"}')])


def test_later_object_that_is_no_call_is_content_and_earlier_calls_count():
    reply = parser.parse(f'{WEATHER}; {{"oops": 1}}')
    assert shape(reply) == (' {"oops": 1}', [("get_weather", '{"city": "Paris"}')])


def test_trailing_semicolon_is_no_content():
    assert shape(parser.parse(f"{WEATHER};")) == (None, [("get_weather", '{"city": "Paris"}')])
