"""Mistral replies: `[TOOL_CALLS]` then a JSON array of calls, or `name[ARGS]{...}` per call."""

from __future__ import annotations

import pytest

from pagoda.engine.parsers.mistral import MistralToolParser
from tests.engine.parsers.recorded_replies import MISTRAL
from tests.engine.parsers.streaming import shape

parser = MistralToolParser()


@pytest.mark.parametrize("name", MISTRAL)
def test_recorded_reply_parses_into_its_content_and_calls(name):
    recorded = MISTRAL[name]
    assert shape(parser.parse(recorded.text)) == (recorded.content, recorded.calls)


@pytest.mark.parametrize("text", [
    "[TOOL_CALLS]",
    "[TOOL_CALLS][]",
    '[TOOL_CALLS][{"arguments": {"city": "Paris"}}]',
    '[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": Paris}}]',
    '[TOOL_CALLS]get weather[ARGS]{"city": "Paris"}',
    '[TOOL_CALLS]get_weather("Paris")[ARGS]{}',
    '[TOOL_CALLS][ARGS]{"city": "Paris"}',
    '[TOOL_CALLS]get_weather[ARGS]["Paris"]',
    '[TOOL_CALLS]get_weather[ARGS]{"city": "Paris"',
    '[TOOL_CALLS]get_weather',
])
def test_tag_that_no_valid_call_follows_is_content(text):
    assert shape(parser.parse(text)) == (text, [])


def test_text_after_the_array_is_content():
    reply = parser.parse('[TOOL_CALLS][{"name": "now", "arguments": {}}] Done.')
    assert shape(reply) == (" Done.", [("now", "{}")])


def test_bad_item_after_a_good_one_is_content_and_the_good_one_counts():
    reply = parser.parse('[TOOL_CALLS][{"name": "now", "arguments": {}}, {"oops"}]')
    assert shape(reply) == (' {"oops"}]', [("now", "{}")])
