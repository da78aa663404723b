"""A response's items and events built from chat deltas, checked against the openai SDK's own
types (a reasoning item too: the bundled model writes none)."""

from __future__ import annotations

from openai.types.responses import ResponseStreamEvent
from pydantic import TypeAdapter

from pagoda.engine.server.responses_stream import ResponseEvents

EVENTS = TypeAdapter(ResponseStreamEvent)
DELTAS = [
    {"reasoning_content": "The user "}, {"reasoning_content": "wants Paris."},
    {"content": "Let me check."},
    {"tool_calls": [{"index": 0, "id": "call_1", "type": "function",
                     "function": {"name": "get_weather", "arguments": '{"city": '}}]},
    {"tool_calls": [{"index": 0, "function": {"arguments": '"Paris"}'}}]},
]


def _built() -> tuple[ResponseEvents, list[dict]]:
    events = ResponseEvents()
    sent = [e for delta in DELTAS for e in events.feed(delta)]
    return events, sent + events.finish("completed")


def test_reasoning_text_and_a_call_become_three_items_in_order():
    events, _ = _built()
    reasoning, message, call = events.items
    assert reasoning["type"] == "reasoning"
    assert reasoning["content"] == [{"type": "reasoning_text", "text": "The user wants Paris."}]
    assert message["content"][0]["text"] == "Let me check."
    assert (call["call_id"], call["name"], call["arguments"]) == \
        ("call_1", "get_weather", '{"city": "Paris"}')
    assert all(item["status"] == "completed" for item in events.items)


def test_every_event_parses_as_the_sdk_types_it_and_numbers_run_in_order():
    _, sent = _built()
    parsed = [EVENTS.validate_python(event) for event in sent]
    assert [e.sequence_number for e in parsed] == list(range(len(sent)))
    assert [e.type for e in parsed if e.type.endswith(".done")][-1] == "response.output_item.done"


def test_an_empty_reply_is_an_empty_message():
    events = ResponseEvents()
    sent = events.finish("incomplete")
    (item,) = events.items
    assert item["type"] == "message" and item["status"] == "incomplete"
    assert item["content"][0]["text"] == ""
    assert sent[-1]["type"] == "response.output_item.done"
