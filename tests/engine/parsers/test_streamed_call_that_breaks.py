"""A streamed call whose text goes wrong after its name and arguments went out cannot be taken
back: it keeps the arguments streamed (as OpenAI's API does when max_tokens cuts a call), the
text after the break is content, and a warning says so. Parsing the whole reply, which can look
ahead, keeps such a call as content instead."""

from __future__ import annotations

import pytest

from pagoda.engine.parsers.registry import tool_parser
from tests.engine.parsers.streaming import shape, streamed, warnings_logged

CUT = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Pa'


def test_reply_cut_inside_streamed_arguments_keeps_the_call_with_what_was_streamed():
    parser = tool_parser("hermes")
    with warnings_logged() as warnings:
        reply = streamed(parser, list(CUT))
    assert shape(reply) == (None, [("get_weather", '{"city": "Pa')])
    assert len(warnings) == 1
    assert shape(parser.parse(CUT)) == (CUT, [])


def test_reply_cut_before_the_arguments_began_is_content_as_when_parsed():
    text = '<tool_call>\n{"name": "get_weather", "argum'
    parser = tool_parser("hermes")
    assert shape(streamed(parser, list(text))) == shape(parser.parse(text)) == (text, [])


def test_invalid_json_after_the_arguments_began_keeps_them_as_written():
    text = '<tool_call>\n{"name": "f", "arguments": {"a": tru}}\n</tool_call>'
    with warnings_logged() as warnings:
        reply = streamed(tool_parser("hermes"), list(text))
    assert shape(reply) == (None, [("f", '{"a": tru}')])
    assert warnings


def test_text_after_a_streamed_call_before_its_closing_tag_is_content():
    text = '<tool_call>\n{"name": "f", "arguments": {}} oops\n</tool_call>Bye'
    with warnings_logged() as warnings:
        reply = streamed(tool_parser("hermes"), list(text))
    assert shape(reply) == (" oops\n</tool_call>Bye", [("f", "{}")])
    assert warnings


def test_streamed_call_that_breaks_mid_object_leaves_the_rest_as_content():
    text = '<tool_call>\n{"name": "f", "arguments": {} ! }\n</tool_call>'
    with warnings_logged():
        reply = streamed(tool_parser("hermes"), [text])
    assert shape(reply) == ("! }\n</tool_call>", [("f", "{}")])


@pytest.mark.parametrize(("family", "text", "arguments"), [
    ("llama3_json", '{"name": "f", "parameters": {"q": "x', '{"q": "x'),
    ("mistral", '[TOOL_CALLS]f[ARGS]{"q": "x', '{"q": "x'),
    ("mistral", '[TOOL_CALLS][{"name": "f", "arguments": {"q": "x', '{"q": "x'),
])
def test_every_family_keeps_a_cut_streamed_call(family, text, arguments):
    with warnings_logged() as warnings:
        reply = streamed(tool_parser(family), list(text))
    assert shape(reply) == (None, [("f", arguments)])
    assert warnings
