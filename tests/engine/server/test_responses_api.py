"""POST /v1/responses through the real openai client against the real server: text, the SDK's
stream, a function tool's round trip, a JSON schema, previous_response_id over the prefix cache,
GET and DELETE, and what is refused."""

from __future__ import annotations

import json

import httpx
import jsonschema
import pytest
from openai import BadRequestError, NotFoundError
from openai.types.responses import Response

from tests.engine.server.conftest import MODEL

SHORT = {"model": MODEL, "temperature": 0, "max_output_tokens": 16}
WEATHER = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"],
           "additionalProperties": False}
TOOLS = [{"type": "function", "name": "get_weather", "description": "A city's weather",
          "parameters": WEATHER}]
PERSON = {"type": "object", "properties": {"name": {"type": "string"},
                                           "age": {"type": "integer"}},
          "required": ["name", "age"], "additionalProperties": False}


def test_a_text_reply_is_one_message_with_its_usage(client):
    response = client.responses.create(input="Say hello.", **SHORT)
    assert response.id.startswith("resp_") and response.object == "response"
    (message,) = response.output
    assert message.type == "message" and message.role == "assistant"
    assert response.output_text == message.content[0].text and response.output_text
    usage = response.usage
    assert usage.total_tokens == usage.input_tokens + usage.output_tokens
    assert usage.output_tokens <= 16


def test_the_response_object_validates_as_the_sdk_type(client):
    raw = client.responses.with_raw_response.create(
        input="Weather?", tools=TOOLS, metadata={"k": "v"}, text={"format": {"type": "text"}},
        **SHORT)
    body = raw.http_response.json()
    assert Response.model_validate(body).tools[0].name == "get_weather"


def test_a_reply_cut_by_max_output_tokens_is_incomplete(client):
    response = client.responses.create(input="Tell me a long story about a dragon.",
                                       **{**SHORT, "max_output_tokens": 4})
    assert response.status == "incomplete"
    assert response.incomplete_details.reason == "max_output_tokens"
    assert response.usage.output_tokens == 4


def test_the_sdk_stream_assembles_the_same_text_as_the_whole_reply(client):
    ask = {"input": [{"role": "user", "content": "Name three colours."}],
           "instructions": "Answer briefly.", **SHORT}
    whole = client.responses.create(**ask)
    with client.responses.stream(**ask) as stream:
        deltas = [e.delta for e in stream if e.type == "response.output_text.delta"]
        final = stream.get_final_response()
    assert len(deltas) > 1 and "".join(deltas) == whole.output_text
    assert final.output_text == whole.output_text and final.status == "completed"
    assert final.usage.output_tokens == whole.usage.output_tokens


def test_streamed_events_are_numbered_in_order_and_end_completed(client):
    events = list(client.responses.create(input="Hi", stream=True, **SHORT))
    assert [e.sequence_number for e in events] == list(range(len(events)))
    kinds = [e.type for e in events]
    assert kinds[:4] == ["response.created", "response.in_progress",
                         "response.output_item.added", "response.content_part.added"]
    assert kinds[-4:] == ["response.output_text.done", "response.content_part.done",
                          "response.output_item.done", "response.completed"]


def test_a_forced_call_and_its_output_make_a_round_trip(client):
    first = client.responses.create(
        input="What is the weather in Paris?", tools=TOOLS,
        tool_choice={"type": "function", "name": "get_weather"}, **SHORT)
    (call,) = [item for item in first.output if item.type == "function_call"]
    assert call.name == "get_weather" and call.call_id
    jsonschema.validate(json.loads(call.arguments), WEATHER)
    second = client.responses.create(
        input=[{"role": "user", "content": "What is the weather in Paris?"},
               {"type": "function_call", "call_id": call.call_id, "name": call.name,
                "arguments": call.arguments},
               {"type": "function_call_output", "call_id": call.call_id,
                "output": '{"sky": "sunny"}'}],
        tools=TOOLS, tool_choice="none", store=False, **SHORT)
    assert second.output[0].type == "message" and second.output_text


def test_a_call_output_can_continue_the_response_that_made_the_call(client):
    first = client.responses.create(
        input="What is the weather in Rome?", tools=TOOLS,
        tool_choice={"type": "function", "name": "get_weather"}, **SHORT)
    call = first.output[0]
    output = {"type": "function_call_output", "call_id": call.call_id, "output": "sunny"}
    continued = client.responses.create(previous_response_id=first.id, input=[output],
                                        tools=TOOLS, tool_choice="none", **SHORT)
    # The same conversation given whole: the question, the call and its output.
    whole = client.responses.create(
        input=[{"role": "user", "content": "What is the weather in Rome?"},
               {"type": "function_call", "call_id": call.call_id, "name": call.name,
                "arguments": call.arguments}, output],
        tools=TOOLS, tool_choice="none", store=False, **SHORT)
    assert continued.usage.input_tokens == whole.usage.input_tokens
    assert continued.output_text == whole.output_text


def test_a_streamed_call_sends_its_arguments_in_pieces(client):
    named = {"input": "Weather in Oslo?", "tools": TOOLS,
             "tool_choice": {"type": "function", "name": "get_weather"}, **SHORT}
    whole = client.responses.create(**named).output[0]
    with client.responses.stream(**named) as stream:
        pieces = [e.delta for e in stream if e.type == "response.function_call_arguments.delta"]
        final = stream.get_final_response()
    assert len(pieces) > 1 and "".join(pieces) == whole.arguments
    assert final.output[0].type == "function_call" and final.output[0].arguments == whole.arguments


def test_a_json_schema_format_gives_json_that_validates(client):
    response = client.responses.create(
        input="Invent a person.", text={"format": {"type": "json_schema", "name": "person",
                                                   "schema": PERSON, "strict": True}},
        **{**SHORT, "max_output_tokens": 40})
    jsonschema.validate(json.loads(response.output_text), PERSON)


def test_previous_response_id_continues_the_conversation_from_the_prefix_cache(client):
    instructions = "You are a careful assistant who answers in one line. " * 8
    first = client.responses.create(input="My name is Ada.", instructions=instructions,
                                    **SHORT)
    second = client.responses.create(input="What is my name?", instructions=instructions,
                                     previous_response_id=first.id, **SHORT)
    # The follow-up's prompt holds the first turn (its input and its reply) and starts with
    # its tokens: the cache serves the whole first prompt and the reply's first tokens (whole
    # blocks of 16; the 16 reply tokens cross a block's end), not only the instructions.
    assert second.usage.input_tokens > first.usage.input_tokens + first.usage.output_tokens
    assert first.usage.output_tokens == 16
    assert second.usage.input_tokens_details.cached_tokens > first.usage.input_tokens
    assert second.previous_response_id == first.id


def test_a_stored_response_can_be_read_back_and_deleted(client):
    made = client.responses.create(input="Hi", metadata={"case": "store"}, **SHORT)
    read = client.responses.retrieve(made.id)
    assert read.output_text == made.output_text and read.metadata == {"case": "store"}
    deleted = client.responses.delete(made.id)
    assert deleted is None or getattr(deleted, "deleted", True)
    with pytest.raises(NotFoundError):
        client.responses.retrieve(made.id)


def test_a_stored_response_takes_no_query_options_and_an_unknown_one_is_404(client, server):
    made = client.responses.create(input="Hi", **SHORT)
    asked = httpx.get(f"{server.url}/v1/responses/{made.id}", params={"stream": "true"})
    assert asked.status_code == 400 and asked.json()["error"]["param"] == "stream"
    assert httpx.delete(f"{server.url}/v1/responses/resp_nope").status_code == 404


def test_a_response_made_with_store_false_is_not_kept(client):
    made = client.responses.create(input="Hi", store=False, **SHORT)
    with pytest.raises(NotFoundError):
        client.responses.retrieve(made.id)


def test_a_request_without_input_is_refused_unless_it_continues_one(client):
    with pytest.raises(BadRequestError) as caught:
        client.responses.create(**SHORT)
    assert caught.value.body["param"] == "input"
    first = client.responses.create(input="Hi", **SHORT)
    assert client.responses.create(previous_response_id=first.id, **SHORT).output_text


def test_an_unknown_previous_response_id_is_a_404_naming_it(client):
    with pytest.raises(NotFoundError) as caught:
        client.responses.create(input="Hi", previous_response_id="resp_nope", **SHORT)
    assert caught.value.body["param"] == "previous_response_id"
    assert caught.value.body["code"] == "response_not_found"


def test_codex_clis_stateless_turn_is_answered(client):
    """Codex CLI sends store false, asks for its reasoning items back to resend them itself
    (include reasoning.encrypted_content) and labels its turn (client_metadata)."""
    response = client.responses.create(
        input="Hi", store=False, include=["reasoning.encrypted_content"],
        extra_body={"client_metadata": {"session_id": "s1", "x-codex-turn-metadata": "{}"}},
        **SHORT)
    assert response.status == "completed" and response.output_text


@pytest.mark.parametrize(("extra", "param"), [
    ({"include": ["message.output_text.logprobs"]}, "include"),
    ({"include": ["reasoning.encrypted_content", "file_search_call.results"]}, "include"),
    ({"client_metadata": {"turn": "x" * 5000}}, "client_metadata"),
    ({"truncation": "auto"}, "truncation"),
    ({"background": True}, "background"),
    ({"prompt": {"id": "pmpt_1"}}, "prompt"),
    ({"service_tier": "flex"}, "service_tier"),
    ({"frobnicate": 1}, "frobnicate"),
    ({"tools": [{"type": "web_search"}]}, "tools[0].type"),
    ({"reasoning": {"effort": "high"}}, "reasoning.effort"),
    ({"text": {"verbosity": "low"}}, "text.verbosity"),
    ({"input": [{"type": "input_image", "image_url": "x"}]}, "input[0].type"),
    ({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]},
     "input[0].content[0].type"),
    ({"input": [{"type": "function_call", "call_id": "c", "name": "f"}]}, "input[0].arguments"),
    ({"tools": TOOLS, "tool_choice": {"type": "function", "name": "nope"}}, "tool_choice.name"),
    ({"text": {"format": {"type": "json_schema", "name": "n", "schema": {"uniqueItems": True}}}},
     "text.format.schema"),
])
def test_what_is_not_honoured_is_refused_naming_the_field(client, extra, param):
    with pytest.raises(BadRequestError) as caught:
        client.responses.create(input="Hi", **SHORT, extra_body=extra)
    assert caught.value.body["param"] == param, caught.value.body["message"]
