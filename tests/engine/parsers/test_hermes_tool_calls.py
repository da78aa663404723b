"""Hermes (Qwen2.5, Qwen3) replies: calls in <tool_call> blocks, content around them, and
blocks the model wrote wrongly kept as content."""

from __future__ import annotations

import pytest

from pagoda.engine.parsers.hermes import HermesToolParser
from tests.engine.parsers.recorded_replies import HERMES, PARIS
from tests.engine.parsers.streaming import shape

parser = HermesToolParser()


def call_block(body: str) -> str:
    return f"<tool_call>\n{body}\n</tool_call>"


GOOD = call_block(f'{{"name": "get_weather", "arguments": {PARIS}}}')


@pytest.mark.parametrize("name", HERMES)
def test_recorded_reply_parses_into_its_content_and_calls(name):
    recorded = HERMES[name]
    assert shape(parser.parse(recorded.text)) == (recorded.content, recorded.calls)


def test_calls_keep_the_arguments_text_the_model_wrote():
    spaced = '{ "city" :"Paris",\n  "days": [1,2] }'
    reply = parser.parse(call_block(f'{{"name": "forecast", "arguments": {spaced}}}'))
    assert reply.tool_calls[0].arguments == spaced


@pytest.mark.parametrize("body", [
    '{"name": "get_weather", "arguments": {"city": "Paris",}}',
    '{"name": "get_weather", "arguments": {"city": Paris}}',
    'get_weather(city="Paris")',
    '{"name": "get_weather" "arguments": {}}',
])
def test_invalid_json_in_a_block_is_kept_as_content(body):
    text = f"Checking.\n{call_block(body)}"
    assert shape(parser.parse(text)) == (text, [])


@pytest.mark.parametrize("body", [
    '{"arguments": {"city": "Paris"}}',
    '{"name": "", "arguments": {}}',
    '{"name": 7, "arguments": {}}',
    '{"name": "get_weather", "arguments": [1, 2]}',
    '{"name": "get_weather", "arguments": "not json"}',
    '{"name": "a", "name": "b", "arguments": {}}',
])
def test_call_without_a_usable_name_or_object_arguments_is_kept_as_content(body):
    assert shape(parser.parse(call_block(body))) == (call_block(body), [])


def test_a_call_nested_past_the_recursion_limit_is_kept_as_content():
    deep = "[" * 5000 + "]" * 5000
    body = f'{{"name": "get_weather", "arguments": {{"days": {deep}}}}}'
    assert shape(parser.parse(call_block(body))) == (call_block(body), [])


def test_bad_block_ends_at_its_closing_tag_and_the_next_call_still_counts():
    bad = call_block("{oops}")
    reply = parser.parse(f"{bad}\n{GOOD}")
    assert shape(reply) == (bad + "\n", [("get_weather", PARIS)])


def test_unclosed_bad_block_ends_where_the_next_call_opens():
    reply = parser.parse(f"<tool_call>\nI will call it.\n{GOOD}")
    assert shape(reply) == ("<tool_call>\nI will call it.\n", [("get_weather", PARIS)])


def test_text_between_the_json_and_the_closing_tag_makes_the_block_content():
    text = call_block(f'{{"name": "get_weather", "arguments": {PARIS}}} and more')
    assert shape(parser.parse(text)) == (text, [])


def test_reply_cut_inside_a_call_is_content():
    text = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Pa'
    assert shape(parser.parse(text)) == (text, [])


def test_reply_of_whitespace_and_calls_has_no_content():
    assert parser.parse(f"\n\n{GOOD}\n").content is None


def test_reply_without_calls_keeps_its_whitespace():
    assert shape(parser.parse("  \n")) == ("  \n", [])
