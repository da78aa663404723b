"""A reply's text becomes the API's message: reasoning_content, content and tool_calls."""

from __future__ import annotations

import json

import pytest

from pagoda.engine.parsers.reasoning import ReasoningParser
from pagoda.engine.parsers.registry import tool_parser
from pagoda.engine.parsers.replies import ReplyShape, reply_shape
from pagoda.engine.parsers.reply import ReplyParser
from pagoda.engine.parsers.tool_use import ToolUse

TOOLS = [{"type": "function", "function": {"name": "add", "parameters": {"type": "object"}}}]
THOUGHT = "<think>\nThe user wants a sum.\n</think>\n\n"
CALL = '<tool_call>\n{"name": "add", "arguments": {"a": 1, "b": 2}}\n</tool_call>'


def _auto(reasoning: bool = True, parallel: bool = True) -> ReplyShape:
    parser = ReplyParser(ReasoningParser() if reasoning else None, tool_parser("hermes"))
    return ReplyShape(ToolUse("auto", TOOLS, parallel=parallel), parser)


def _streamed(shape: ReplyShape, text: str, size: int) -> dict:
    stream, joined = shape.streamer(), {"content": "", "reasoning_content": "", "calls": {}}
    deltas = [stream.feed(text[i:i + size]) for i in range(0, len(text), size)]
    for delta in [*deltas, stream.finish()]:
        joined["content"] += delta.get("content", "")
        joined["reasoning_content"] += delta.get("reasoning_content", "")
        for call in delta.get("tool_calls", []):
            entry = joined["calls"].setdefault(call["index"], {"name": None, "arguments": ""})
            entry["name"] = call["function"].get("name") or entry["name"]
            entry["arguments"] += call["function"]["arguments"]
    joined["called"] = stream.called
    return joined


def test_thinking_goes_to_reasoning_content_and_the_call_to_tool_calls():
    message = _auto().message(THOUGHT + CALL)
    assert message["reasoning_content"] == "\nThe user wants a sum.\n"
    assert message["content"] is None
    (call,) = message["tool_calls"]
    assert call["function"]["name"] == "add"
    assert json.loads(call["function"]["arguments"]) == {"a": 1, "b": 2}


def test_a_streamed_reply_splits_the_same_way_in_any_chunk_size():
    whole = _auto().message(THOUGHT + "Let me add.\n" + CALL)
    for size in (1, 3, 7, 50):
        streamed = _streamed(_auto(), THOUGHT + "Let me add.\n" + CALL, size)
        assert streamed["reasoning_content"] == whole["reasoning_content"]
        assert streamed["content"] == whole["content"]
        assert streamed["called"]
        arguments = streamed["calls"][0]["arguments"]
        assert arguments == whole["tool_calls"][0]["function"]["arguments"]


def test_without_parallel_calls_only_the_first_call_is_kept():
    two = CALL + "\n" + CALL.replace('"a": 1', '"a": 5')
    assert len(_auto(parallel=True).message(two)["tool_calls"]) == 2
    assert len(_auto(parallel=False).message(two)["tool_calls"]) == 1
    assert list(_streamed(_auto(parallel=False), two, 4)["calls"]) == [0]


def test_a_reply_without_calls_keeps_its_text_and_no_tool_calls_key():
    message = _auto(reasoning=False).message("Three.")
    assert message == {"role": "assistant", "content": "Three."}


def test_a_required_list_of_calls_becomes_tool_calls():
    shape = reply_shape(None, ToolUse("required", TOOLS), lambda: "")
    text = '[{"name": "add", "parameters": {"a": 1}}, {"name": "add", "parameters": {"a": 2}}]'
    calls = shape.message(text)["tool_calls"]
    assert [json.loads(c["function"]["arguments"]) for c in calls] == [{"a": 1}, {"a": 2}]
    assert len({c["id"] for c in calls}) == 2


def test_a_required_reply_cut_short_stays_text():
    shape = reply_shape(None, ToolUse("required", TOOLS), lambda: "")
    message = shape.message('[{"name": "add", "param')
    assert message["content"] == '[{"name": "add", "param' and "tool_calls" not in message


def test_required_calls_stream_as_they_are_written_in_any_chunk_size():
    shape = reply_shape(None, ToolUse("required", TOOLS), lambda: "")
    text = '[{"name": "add", "parameters": {"a": 1}}, {"name": "add", "parameters": {"b": 2}}]'
    for size in (1, 5, 200):
        streamed = _streamed(shape, text, size)
        assert streamed["called"] and streamed["content"] == ""
        assert [json.loads(c["arguments"]) for c in streamed["calls"].values()] == [
            {"a": 1}, {"b": 2}]
    stream = shape.streamer()
    early = [stream.feed(text[i:i + 4]) for i in range(0, 40, 4)]
    assert any("tool_calls" in delta for delta in early)  # before the list is whole


def test_a_parser_whose_tags_are_special_tokens_keeps_them_in_the_text():
    from pagoda.engine.sampling.params import SamplingParams

    plain = SamplingParams()
    for family, kept in (("hermes", True), ("mistral", False), ("llama3_json", False)):
        shape = ReplyShape(ToolUse("auto", TOOLS), ReplyParser(None, tool_parser(family)))
        assert shape.adjusted(plain).skip_special_tokens is kept
    assert _auto().adjusted(plain) is plain


THINKING = "{% for m in messages %}{{ m.content }}{% endfor %}<think></think>"
PIECES = ["<think>", "Two", " and", " two", ".", "</", "think>", "4", "."]


def _text(token_ids: list[int]) -> str:
    return "".join(PIECES[i] for i in token_ids)


@pytest.mark.parametrize(("opened", "pieces", "expected"), [
    (False, PIECES, 5),        # <think> and four pieces of reasoning; not its end tag
    (True, PIECES[1:], 4),     # the prompt opened the reasoning
    (False, ["4", "."], 0),    # no reasoning at all
])
def test_the_reasoning_tokens_are_those_that_wrote_the_reasoning(opened, pieces, expected):
    shape = reply_shape(THINKING, ToolUse("none", None), lambda: "<think>" if opened else "")
    ids = [PIECES.index(piece) for piece in pieces]
    assert shape.reasoning_tokens(ids, _text) == expected


def test_a_model_that_does_not_reason_has_no_reasoning_tokens():
    shape = reply_shape(None, ToolUse("none", None), lambda: "")
    assert shape.reasoning_tokens([0, 1, 2], _text) == 0
