"""The small parts under the backends: reading server-sent events, measuring speed, guessing a
chat's length, and tokenizing beside the engine thread."""

import asyncio
import json

import pytest
from conftest import run

from pagoda.app.backends import ChatMessage, SamplingOptions, ToolCallRecord
from pagoda.app.backends.chat.estimate import estimate_tokens
from pagoda.app.backends.chat.meter import ThroughputMeter
from pagoda.app.backends.chat.reply_parts import NOTHING, ReplyParts
from pagoda.app.backends.remote.sse import sse_data
from pagoda.engine.text.chat_template import encode_chat


async def events(lines: list[str]) -> list[str]:
    async def source():
        for line in lines:
            yield line

    return [data async for data in sse_data(source())]


def test_events_are_split_on_blank_lines_and_comments_skipped():
    lines = [": ping", "", "data: {\"a\": 1}", "", "event: message", "id: 7", "data:{\"b\": 2}",
             "", ": keep-alive", "data: [DONE]", ""]
    assert run(events(lines)) == ['{"a": 1}', '{"b": 2}', "[DONE]"]


def test_data_lines_of_one_event_are_joined_with_newlines():
    assert run(events(["data: first", "data: second", ""])) == ["first\nsecond"]


def test_event_cut_off_by_the_end_of_the_stream_is_still_read():
    assert run(events(["data: last"])) == ["last"]


def test_speed_is_measured_over_the_recent_arrivals():
    meter = ThroughputMeter(window_s=5.0)
    for i in range(11):
        meter.add(1, now=100.0 + i * 0.1)
    assert abs(meter.rate(now=101.0) - 10.0) < 1e-6
    assert meter.rate(now=107.0) == 0.0


def test_speed_is_zero_before_two_arrivals():
    meter = ThroughputMeter()
    meter.add(1, now=1.0)
    assert meter.rate(now=1.0) == 0.0


def test_estimate_is_marked_as_such_and_counts_other_scripts_per_character():
    english = estimate_tokens([ChatMessage("user", "a" * 400)])
    chinese = estimate_tokens([ChatMessage("user", "猫" * 400)])
    assert not english.exact and not chinese.exact
    assert 100 <= english.n < chinese.n


def test_estimate_counts_the_arguments_of_an_assistants_calls():
    call = ToolCallRecord("call_1", "search", '{"query": "' + "word " * 100 + '"}')
    bare = estimate_tokens([ChatMessage("assistant", "")])
    calling = estimate_tokens([ChatMessage("assistant", "", tool_calls=(call,))])
    assert calling.n >= bare.n + 100


def test_a_plain_message_is_written_as_its_role_and_content_alone():
    assert ChatMessage("user", "Hi").as_dict() == {"role": "user", "content": "Hi"}


@pytest.mark.parametrize(("role", "calls", "call_id"), [
    ("user", (ToolCallRecord("call_1", "search", "{}"),), None),
    ("tool", (), None),
    ("assistant", (), "call_1"),
])
def test_tool_fields_on_the_wrong_message_are_refused(role, calls, call_id):
    with pytest.raises(ValueError, match="tool"):
        ChatMessage(role, "x", tool_calls=calls, tool_call_id=call_id)


def test_counting_tokens_while_the_engine_streams_is_safe_and_exact(local_backend):
    chat = [ChatMessage("user", "Write a long poem about the sea, " * 20)]

    async def count_while_streaming() -> tuple[set[int], str]:
        async def reply() -> str:
            text = ""
            async for chunk in local_backend.stream(chat, SamplingOptions(temperature=0.0,
                                                                          max_tokens=24)):
                text = chunk.text
            return text

        streaming = asyncio.ensure_future(reply())
        counts = set()
        while not streaming.done():
            counts.add((await local_backend.count_tokens(chat)).n)
            await asyncio.sleep(0.01)  # a chat counted before answers without waiting
        return counts, await streaming

    counts, text = run(count_while_streaming())
    expected = len(encode_chat(local_backend.engine.tokenizer, [m.as_dict() for m in chat]))
    assert counts == {expected} and text


@pytest.mark.parametrize("said", ["temperature must be at most 2.", "temperature must be at most 2"])
def test_a_servers_message_is_quoted_without_a_doubled_full_stop(said):
    from pagoda.app.backends.remote.http_errors import error_for_status

    error = error_for_status(400, json.dumps({"error": {"message": said}}), "http://gpu:8000/v1")

    assert "at most 2. Check" in str(error) and ".." not in str(error)


def test_quoting_keeps_an_ellipsis_and_drops_one_full_stop():
    from pagoda.app.backends.errors import clause

    assert clause("cut short...") == "cut short..."
    assert clause(" no such file. ") == "no such file"
    assert clause(ValueError("bad value.")) == "bad value"


@pytest.mark.parametrize("pieces", [["<think>plan it</think>", "Answer."],
                                    ["<th", "ink>plan", " it</thi", "nk>\n\nAns", "wer."],
                                    ["  <think>plan it</think>Answer."]])
def test_think_tags_in_a_servers_content_are_read_as_reasoning(pieces):
    parts = ReplyParts()
    chunks = [parts.chunk(parts.add({"content": piece}) or NOTHING) for piece in pieces]
    chunks.append(parts.chunk(NOTHING, "stop"))
    assert "".join(c.delta_reasoning for c in chunks) == "plan it"
    assert "".join(c.delta_text for c in chunks) == "Answer."
    assert (chunks[-1].reasoning, chunks[-1].text) == ("plan it", "Answer.")


def test_text_that_only_looks_like_a_tag_at_first_is_the_answer():
    parts = ReplyParts()
    first = parts.add({"content": "<th"})
    last = parts.chunk(NOTHING, "stop")
    assert first is None and (last.delta_text, last.text, last.reasoning) == ("<th", "<th", "")
