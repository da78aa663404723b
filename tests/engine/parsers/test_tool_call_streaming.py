"""Streamed tool calls: however the reply is cut into deltas, the stream adds up to what parsing
the whole reply gives; content goes out as soon as it cannot begin a tag, arguments as they
arrive."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pagoda.engine.parsers.registry import tool_parser
from pagoda.engine.parsers.tool_calls import join_deltas
from tests.engine.parsers.recorded_replies import ALL, BY_FAMILY, PARIS
from tests.engine.parsers.streaming import (
    cuts_of,
    pieces,
    shape,
    stream,
    streamed,
    warnings_logged,
)

IDS = [f"{family}-{name}" for family, name, _ in ALL]


@pytest.mark.parametrize(("family", "name", "recorded"), ALL, ids=IDS)
@settings(max_examples=60, deadline=None)
@given(data=st.data())
def test_any_split_of_a_recorded_reply_streams_what_parse_gives(family, name, recorded, data):
    parser = tool_parser(family)
    chunks = pieces(recorded.text, data.draw(cuts_of(recorded.text)))
    assert shape(streamed(parser, chunks)) == (recorded.content, recorded.calls)


@pytest.mark.parametrize(("family", "name", "recorded"), ALL, ids=IDS)
def test_a_reply_fed_one_character_at_a_time_streams_what_parse_gives(family, name, recorded):
    parser = tool_parser(family)
    whole = shape(parser.parse(recorded.text))
    assert shape(streamed(parser, list(recorded.text))) == whole == (recorded.content,
                                                                      recorded.calls)


# Pieces of every family's syntax, so that drawn replies hit tags, JSON and their breakages.
FRAGMENTS = ["<tool_call>", "</tool_call>", "<|python_tag|>", "[TOOL_CALLS]", "[ARGS]", "{", "}",
             "[", "]", '"name"', '"arguments"', '"parameters"', ":", ",", ";", '"f"', '"a\\"}"',
             "\\", '"', " ", "\n", "null", "1", "x", "é", "<tool_", "[TOOL"]


@pytest.mark.parametrize("family", ["hermes", "llama3_json", "mistral"])
@settings(max_examples=300, deadline=None)
@given(parts=st.lists(st.sampled_from(FRAGMENTS), max_size=30), data=st.data())
def test_any_reply_streams_what_parse_gives_unless_a_streamed_call_broke(family, parts, data):
    parser = tool_parser(family)
    text = "".join(parts)
    chunks = pieces(text, data.draw(cuts_of(text)))
    with warnings_logged() as warnings:
        in_pieces = shape(streamed(parser, chunks))
    assert in_pieces == shape(streamed(parser, [text]))
    if not warnings:
        assert in_pieces == shape(parser.parse(text))


@st.composite
def mangled_replies(draw: st.DrawFn, family: str) -> str:
    """Recorded replies of a family run together, then cut, or edited where a model slips."""
    texts = [recorded.text for recorded in BY_FAMILY[family].values()]
    text = "".join(draw(st.lists(st.sampled_from(texts), min_size=1, max_size=3)))
    for _ in range(draw(st.integers(0, 3))):
        at = draw(st.integers(0, len(text)))
        edit = draw(st.sampled_from(["cut", "delete", "insert"]))
        if edit == "cut":
            text = text[:at]
        elif edit == "delete":
            text = text[:at] + text[at + 1:]
        else:
            text = text[:at] + draw(st.sampled_from('{}[]",:; \\nx')) + text[at:]
    return text


@pytest.mark.parametrize("family", ["hermes", "llama3_json", "mistral"])
@settings(max_examples=300, deadline=None)
@given(data=st.data())
def test_mangled_replies_stream_what_parse_gives_unless_a_streamed_call_broke(family, data):
    parser = tool_parser(family)
    text = data.draw(mangled_replies(family))
    chunks = pieces(text, data.draw(cuts_of(text)))
    with warnings_logged() as warnings:
        in_pieces = shape(streamed(parser, chunks))
    assert in_pieces == shape(streamed(parser, [text]))
    if not warnings:
        assert in_pieces == shape(parser.parse(text))


def test_content_goes_out_before_the_tag_is_complete():
    streamer = tool_parser("hermes").streamer()
    assert streamer.feed("Let me check that.\n<tool_").content == "Let me check that.\n"
    assert streamer.feed("call").content == ""


def test_held_start_of_a_tag_that_never_came_is_content_at_the_end():
    streamer = tool_parser("hermes").streamer()
    assert streamer.feed("Compare a <tool_ca").content == "Compare a "
    assert streamer.finish().content == "<tool_ca"


def test_arguments_stream_before_the_call_ends():
    streamer = tool_parser("hermes").streamer()
    first = streamer.feed('<tool_call>\n{"name": "get_weather", "arguments": {"city": "Pa')
    later = streamer.feed('ris", "unit"')
    assert [(d.index, d.name, d.arguments) for d in first.tool_calls] == [
        (0, "get_weather", '{"city": "Pa')]
    assert [(d.index, d.id, d.name, d.arguments) for d in later.tool_calls] == [
        (0, None, None, 'ris", "unit"')]


@pytest.mark.parametrize("family", ["llama3_json", "mistral"])
def test_other_families_stream_arguments_before_the_call_ends(family):
    text = {"llama3_json": '{"name": "get_weather", "parameters": {"city": "Pa',
            "mistral": '[TOOL_CALLS]get_weather[ARGS]{"city": "Pa'}[family]
    delta = tool_parser(family).streamer().feed(text)
    assert [(d.name, d.arguments) for d in delta.tool_calls] == [("get_weather", '{"city": "Pa')]


def test_each_call_is_named_once_then_continued_by_index():
    family, _, recorded = ALL[0]
    deltas = stream(tool_parser(family), list(recorded.text))
    parts = [part for delta in deltas for part in delta.tool_calls]
    firsts = [part for part in parts if part.id is not None]
    assert [(part.index, part.name) for part in firsts] == [(0, "get_weather"), (1, "get_weather")]
    assert all(part.name is None for part in parts if part.id is None)
    assert len({part.id for part in firsts}) == 2


def test_streamed_arguments_join_into_valid_json():
    text = f'<tool_call>\n{{"name": "get_weather", "arguments": {PARIS}}}\n</tool_call>'
    reply = join_deltas(stream(tool_parser("hermes"), list(text)))
    assert json.loads(reply.tool_calls[0].arguments) == json.loads(PARIS)


def test_whitespace_before_calls_never_goes_out_as_content():
    text = '\n\n<tool_call>\n{"name": "now", "arguments": {}}\n</tool_call>\n'
    deltas = stream(tool_parser("hermes"), list(text))
    assert "".join(delta.content for delta in deltas) == ""


def test_call_whose_arguments_are_a_json_string_goes_out_whole_once_decoded():
    streamer = tool_parser("hermes").streamer()
    held = streamer.feed('<tool_call>\n{"name": "f", "arguments": "{\\"a\\": ')
    done = streamer.feed('1}"}')
    assert held.tool_calls == []
    assert [(d.name, d.arguments) for d in done.tool_calls] == [("f", '{"a": 1}')]


def test_a_call_read_within_one_delta_comes_as_one_part():
    delta = tool_parser("hermes").streamer().feed(
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>')
    assert [(d.index, d.name, d.arguments) for d in delta.tool_calls] == [
        (0, "get_weather", '{"city": "Paris"}')]


def test_mistral_arguments_that_are_no_object_never_go_out():
    text = '[TOOL_CALLS]get_weather[ARGS]["Paris"]'
    assert shape(streamed(tool_parser("mistral"), list(text))) == (text, [])
