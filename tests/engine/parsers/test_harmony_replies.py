"""gpt-oss's harmony replies: the analysis channel is reasoning, a commentary message to
`functions.NAME` is a call, the final channel is content; whole, and streamed cut anywhere
(inside special tokens, JSON and text alike)."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pagoda.engine.parsers.harmony import MAX_HEADER_CHARS, HarmonyParser
from pagoda.engine.parsers.replies import reply_shape
from pagoda.engine.parsers.reply import ReplyDelta
from pagoda.engine.parsers.tool_use import ToolUse
from pagoda.engine.sampling.params import SamplingParams, StructuredOutputsParams
from tests.engine.harmony_chat import HARMONY_TEMPLATE
from tests.engine.parsers.streaming import cuts_of, pieces, warnings_logged


@dataclass(frozen=True, slots=True)
class Harmony:
    """A reply as gpt-oss writes it after `<|start|>assistant` (stop token not in the text),
    and what it holds."""

    text: str
    reasoning: str | None
    content: str | None
    calls: list[tuple[str, str]]


WEATHER = '{"location": "Tokyo", "unit": "celsius"}'
# A JSON string holding the start of a frame token, braces and escapes (a whole frame token
# ends the message wherever it comes, as harmony's special tokens do).
TRICKY = r'{"code": "print(\"<|end\") if x else {}", "path": "C:\\tmp\\"}'
REPLIES = {
    "reasoning_then_answer": Harmony(
        "<|channel|>analysis<|message|>User asks a simple question. Answer: 4.<|end|>"
        "<|start|>assistant<|channel|>final<|message|>2 + 2 = 4.",
        "User asks a simple question. Answer: 4.", "2 + 2 = 4.", []),
    "reasoning_then_call_recipient_in_channel": Harmony(
        "<|channel|>analysis<|message|>Need to use function get_weather.<|end|>"
        "<|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json"
        f"<|message|>{WEATHER}",
        "Need to use function get_weather.", None, [("get_weather", WEATHER)]),
    "call_recipient_in_role_and_its_call_token": Harmony(
        f" to=functions.get_weather<|channel|>commentary json<|message|>{WEATHER}<|call|>",
        None, None, [("get_weather", WEATHER)]),
    "preamble_on_commentary_then_call": Harmony(
        "<|channel|>analysis<|message|>Look it up.<|end|>"
        "<|start|>assistant<|channel|>commentary<|message|>Checking the weather first.<|end|>"
        "<|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json"
        f"<|message|>{WEATHER}",
        "Look it up.", "Checking the weather first.", [("get_weather", WEATHER)]),
    "arguments_with_frame_text_inside_a_string": Harmony(
        "<|channel|>commentary to=functions.run <|constrain|>json<|message|>"
        f"{TRICKY}<|call|>", None, None, [("run", TRICKY)]),
    "answer_ended_by_return_with_unicode": Harmony(
        "<|channel|>analysis<|message|>Translate: 北京.<|end|>"
        "<|start|>assistant<|channel|>final<|message|>Pékin 🎉\n<|return|>",
        "Translate: 北京.", "Pékin 🎉\n", []),
    "final_answer_alone": Harmony(
        "<|channel|>final<|message|>Hello! How can I help?", None, "Hello! How can I help?", []),
    "reasoning_cut_by_max_tokens": Harmony(
        "<|channel|>analysis<|message|>Let me think about th", "Let me think about th", "", []),
    "call_whose_json_is_no_object_stays_content": Harmony(
        "<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>Tokyo",
        None, "Tokyo", []),
    "call_on_the_analysis_channel": Harmony(
        f"<|channel|>analysis to=functions.get_weather<|message|>{WEATHER}<|call|>",
        None, None, [("get_weather", WEATHER)]),
    "stray_channel_before_the_real_one": Harmony(
        "<|channel|>commentary to=assistant<|channel|>analysis<|message|>Hmm.<|end|>"
        "<|start|>assistant<|channel|>commentary to=assistant<|channel|>final<|message|>Done.",
        "Hmm.", "Done.", []),
    "final_answer_constrained_to_json": Harmony(
        "<|channel|>analysis<|message|>Give JSON.<|end|><|start|>assistant"
        '<|channel|>final <|constrain|>json<|message|>{"total": 12.5}',
        "Give JSON.", '{"total": 12.5}', []),
    "message_to_a_tool_never_offered_is_content": Harmony(
        "<|channel|>commentary to=python <|constrain|>code<|message|>print(1)", None,
        "print(1)", []),
    "text_without_any_frame_is_content": Harmony("Plain words, no channels.", None,
                                                 "Plain words, no channels.", []),
}
IDS = list(REPLIES)


def streamed(chunks: list[str], parser: HarmonyParser | None = None) -> list[ReplyDelta]:
    streamer = (parser or HarmonyParser()).streamer()
    return [*(streamer.feed(chunk) for chunk in chunks), streamer.finish()]


def joined(deltas: list[ReplyDelta]) -> tuple[str, str, list[tuple[str, str]]]:
    """(reasoning, content, calls) a stream adds up to, ids aside."""
    calls: list[list[str]] = []
    for delta in deltas:
        for part in delta.tool_calls:
            if part.index == len(calls):
                calls.append([part.name, part.arguments])
            else:
                calls[part.index][1] += part.arguments
    return ("".join(d.reasoning for d in deltas), "".join(d.content for d in deltas),
            [(name, arguments) for name, arguments in calls])


def expected(reply: Harmony) -> tuple[str, str, list[tuple[str, str]]]:
    return reply.reasoning or "", reply.content or "", reply.calls


@pytest.mark.parametrize("name", IDS)
def test_a_whole_reply_splits_into_reasoning_content_and_calls(name):
    reply = REPLIES[name]
    parts = HarmonyParser().parse(reply.text)
    assert parts.reasoning == reply.reasoning
    assert parts.content == reply.content
    assert [(c.name, c.arguments) for c in parts.tool_calls] == reply.calls


@pytest.mark.parametrize("name", IDS)
@settings(max_examples=40, deadline=None)
@given(data=st.data())
def test_any_split_of_a_reply_streams_what_parse_gives(name, data):
    reply = REPLIES[name]
    chunks = pieces(reply.text, data.draw(cuts_of(reply.text)))
    assert joined(streamed(chunks)) == expected(reply)


@pytest.mark.parametrize("name", IDS)
def test_a_reply_fed_one_character_at_a_time_streams_what_parse_gives(name):
    reply = REPLIES[name]
    assert joined(streamed(list(reply.text))) == expected(reply)


def test_a_call_streams_its_name_first_then_its_arguments_as_they_arrive():
    deltas = streamed(list(REPLIES["reasoning_then_call_recipient_in_channel"].text))
    parts = [part for delta in deltas for part in delta.tool_calls]
    assert parts[0].id.startswith("call_") and parts[0].name == "get_weather"
    assert parts[0].arguments == "{"
    assert all(p.id is None and p.name is None and p.index == 0 for p in parts[1:])
    assert len(parts) == len(WEATHER)


def test_reasoning_streams_before_the_answer_and_never_shows_the_frame():
    deltas = streamed(list(REPLIES["reasoning_then_answer"].text))
    first_content = next(i for i, d in enumerate(deltas) if d.content)
    assert "".join(d.reasoning for d in deltas[:first_content]) == \
        "User asks a simple question. Answer: 4."
    assert not any("<|" in d.reasoning + d.content for d in deltas)


def test_without_tools_a_call_message_is_content():
    reply = REPLIES["reasoning_then_call_recipient_in_channel"]
    parts = HarmonyParser(reads_calls=False).parse(reply.text)
    assert (parts.reasoning, parts.content, parts.tool_calls) == (
        "Need to use function get_weather.", WEATHER, [])


def test_a_header_that_never_reaches_its_message_is_content_not_held_forever():
    text = "<|channel|>" + "x" * (MAX_HEADER_CHARS + 20)
    deltas = streamed(list(text))
    assert joined(deltas) == ("", text, [])
    assert not deltas[-1].content  # shown while streaming, not only at the end


# Pieces of harmony's frames, JSON and text, so that drawn replies hit every state and breakage.
FRAGMENTS = ["<|start|>", "assistant", "<|channel|>", "analysis", "final", "commentary",
             " to=functions.f", " to=functions.", " to=python", " <|constrain|>", "json",
             "<|message|>", "<|end|>", "<|call|>", "<|return|>", "{", "}", '"a"', ":", "1",
             '"x}"', "\\", " ", "\n", "é", "text", "<|", "<|chan", "<|end"]


@settings(max_examples=300, deadline=None)
@given(parts=st.lists(st.sampled_from(FRAGMENTS), max_size=30), data=st.data())
def test_any_reply_streams_what_parse_gives_unless_a_streamed_call_broke(parts, data):
    text = "".join(parts)
    chunks = pieces(text, data.draw(cuts_of(text)))
    with warnings_logged() as warnings:
        in_pieces = joined(streamed(chunks))
    whole = HarmonyParser().parse(text)
    whole_shape = (whole.reasoning or "", whole.content or "",
                   [(c.name, c.arguments) for c in whole.tool_calls])
    if not warnings:
        assert in_pieces == whole_shape
    assert in_pieces[0] == whole_shape[0]  # reasoning never depends on the cuts


TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"location": {"type": "string"}},
    "required": ["location"]}}}]


def test_a_harmony_template_reads_replies_into_openai_message_fields():
    shape = reply_shape(HARMONY_TEMPLATE, ToolUse("auto", TOOLS), lambda: "")
    message = shape.message(REPLIES["reasoning_then_call_recipient_in_channel"].text)
    assert message["reasoning_content"] == "Need to use function get_weather."
    assert message["content"] is None
    assert [c["function"] for c in message["tool_calls"]] == [
        {"name": "get_weather", "arguments": WEATHER}]


def test_a_harmony_reply_keeps_its_frame_tokens_and_ends_at_its_call_or_return():
    shape = reply_shape(HARMONY_TEMPLATE, ToolUse("auto", TOOLS), lambda: "")
    params = shape.adjusted(SamplingParams(stop=["END"]))
    assert params.skip_special_tokens is False
    assert params.stop == ["END", "<|call|>", "<|return|>"]  # whatever the model's stop tokens
    assert params.structured_outputs is None


def test_a_named_function_under_harmony_is_read_from_its_frame_and_constrained_in_it():
    use = ToolUse("named", TOOLS, "get_weather")
    shape = reply_shape(HARMONY_TEMPLATE, use, lambda: "")
    params = shape.adjusted(SamplingParams(structured_outputs=use.constraint))
    assert params.structured_outputs.kind == "structural_tag"
    assert "to=functions.get_weather" in params.structured_outputs.structural_tag
    message = shape.message(REPLIES["reasoning_then_call_recipient_in_channel"].text)
    assert message["reasoning_content"] == "Need to use function get_weather."
    assert message["tool_calls"][0]["function"]["arguments"] == WEATHER


def test_a_response_format_under_harmony_constrains_the_final_message():
    shape = reply_shape(HARMONY_TEMPLATE, ToolUse("none", None), lambda: "")
    params = shape.adjusted(SamplingParams(
        structured_outputs=StructuredOutputsParams(json={"type": "object"})))
    assert params.structured_outputs.kind == "structural_tag"
    assert "<|channel|>final<|message|>" in params.structured_outputs.structural_tag
