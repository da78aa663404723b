"""A reply's reasoning comes first; tool calls are looked for only in the answer after it."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pagoda.engine.parsers.reasoning import ReasoningParser
from pagoda.engine.parsers.registry import tool_parser
from pagoda.engine.parsers.reply import ReplyParser, ReplyParts
from pagoda.engine.parsers.tool_calls import ParsedReply, StreamDelta, join_deltas
from tests.engine.parsers.recorded_replies import PARIS
from tests.engine.parsers.streaming import cuts_of, pieces

QWEN3 = ("<think>\nThe user asks for Paris weather; I could write <tool_call> but should not "
         "here.\n</think>\n\nI'll check.\n"
         f'<tool_call>\n{{"name": "get_weather", "arguments": {PARIS}}}\n</tool_call>')
REASONING = "\nThe user asks for Paris weather; I could write <tool_call> but should not here.\n"
both = ReplyParser(ReasoningParser(), tool_parser("hermes"))


def shape(parts: ReplyParts) -> tuple:
    return parts.reasoning, parts.content, [(c.name, c.arguments) for c in parts.tool_calls]


def streamed(parser: ReplyParser, chunks: list[str], starts_in_reasoning: bool = False) -> tuple:
    streamer = parser.streamer(starts_in_reasoning=starts_in_reasoning)
    deltas = [*(streamer.feed(chunk) for chunk in chunks), streamer.finish()]
    calls = join_deltas([StreamDelta("", d.tool_calls) for d in deltas]).tool_calls
    content = "".join(d.content for d in deltas)
    return ("".join(d.reasoning for d in deltas) or None,
            None if calls and not content.strip() else content,
            [(c.name, c.arguments) for c in calls])


def test_reasoning_then_calls_are_split_and_tags_inside_reasoning_are_no_calls():
    assert shape(both.parse(QWEN3)) == (REASONING, "I'll check.\n", [("get_weather", PARIS)])


@settings(max_examples=100, deadline=None)
@given(data=st.data())
def test_any_split_streams_what_parse_gives(data):
    chunks = pieces(QWEN3, data.draw(cuts_of(QWEN3)))
    assert streamed(both, chunks) == shape(both.parse(QWEN3))


def test_reply_after_a_prompt_that_opened_reasoning_has_its_calls_after_the_end_tag():
    text = QWEN3.removeprefix("<think>")
    expected = (REASONING, "I'll check.\n", [("get_weather", PARIS)])
    assert shape(both.parse(text, starts_in_reasoning=True)) == expected
    assert streamed(both, list(text), starts_in_reasoning=True) == expected


def test_reply_cut_mid_thinking_has_no_content_and_no_calls():
    text = "<think>\nI should call <tool_call>\n{\"name\": \"get_weather\""
    expected = (text.removeprefix("<think>"), "", [])
    assert shape(both.parse(text)) == expected
    assert streamed(both, list(text)) == expected


def test_without_a_tool_parser_call_syntax_is_content():
    parser = ReplyParser(ReasoningParser())
    assert shape(parser.parse(QWEN3)) == (REASONING, QWEN3.split("</think>\n\n")[1], [])


def test_without_a_reasoning_parser_think_tags_are_content():
    parser = ReplyParser(tools=tool_parser("hermes"))
    parts = parser.parse(QWEN3)
    assert parts.reasoning is None
    assert parts.content.startswith("<think>")
    assert len(parts.tool_calls) == 1


def test_without_parsers_the_reply_is_content():
    assert shape(ReplyParser().parse("Hello.")) == (None, "Hello.", [])
    assert streamed(ReplyParser(), ["Hel", "lo."]) == (None, "Hello.", [])


def test_starting_in_reasoning_without_a_reasoning_parser_is_refused():
    with pytest.raises(ValueError, match="reasoning parser"):
        ReplyParser(tools=tool_parser("hermes")).parse("x", starts_in_reasoning=True)


def test_parsed_reply_shape_matches_the_tool_parser_alone():
    answer = QWEN3.split("</think>\n\n")[1]
    alone: ParsedReply = tool_parser("hermes").parse(answer)
    parts = both.parse(QWEN3)
    assert (parts.content, [(c.name, c.arguments) for c in parts.tool_calls]) == (
        alone.content, [(c.name, c.arguments) for c in alone.tool_calls])
