"""A server started with --force-tool-call (ServedModel.force_tool_call): a request that offers
tools under "auto" calls one when the chat asks something new, through each of the three
protocols and their real clients, and once a call's result is back the model chooses again."""

from __future__ import annotations

import json
from dataclasses import replace

import jsonschema
import pytest
from anthropic import Anthropic
from openai import OpenAI

from tests.engine.server.conftest import MODEL

WEATHER = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "A city's weather",
                                           "parameters": WEATHER}}]
# Asked this with the tool offered, the bundled model answers in words when it may choose.
ASK = [{"role": "user", "content": "Say hello to me."}]
CALLED = [*ASK, {"role": "assistant", "content": None, "tool_calls": [
    {"id": "call_1", "type": "function",
     "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]},
    {"role": "tool", "tool_call_id": "call_1", "content": "Sunny, 21 C"}]
SHORT = {"model": MODEL, "temperature": 0, "max_tokens": 40}


@pytest.fixture(scope="module")
def forcing(start_server, served):
    return start_server(source=lambda: replace(served, force_tool_call=True))


def openai_client(server) -> OpenAI:
    return OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0, timeout=60)


def test_the_model_answers_in_words_when_the_server_does_not_force(client):
    reply = client.chat.completions.create(messages=ASK, tools=TOOLS, **SHORT).choices[0]
    assert reply.finish_reason != "tool_calls" and reply.message.content


@pytest.mark.parametrize("tool_choice", [None, "auto"])
def test_a_new_question_with_tools_under_auto_is_answered_by_a_call(forcing, tool_choice):
    extra = {} if tool_choice is None else {"tool_choice": tool_choice}
    reply = openai_client(forcing).chat.completions.create(
        messages=ASK, tools=TOOLS, parallel_tool_calls=False, **SHORT, **extra).choices[0]
    assert reply.finish_reason == "tool_calls"
    (call,) = reply.message.tool_calls
    assert call.function.name == "get_weather"
    jsonschema.validate(json.loads(call.function.arguments), WEATHER)


def test_after_a_result_the_model_chooses_as_it_would_unforced(forcing, client):
    forced = openai_client(forcing).chat.completions.create(messages=CALLED, tools=TOOLS, **SHORT)
    free = client.chat.completions.create(messages=CALLED, tools=TOOLS, **SHORT)
    assert forced.choices[0].message == free.choices[0].message


def test_the_clients_none_and_own_format_are_kept(forcing):
    openai = openai_client(forcing)
    none = openai.chat.completions.create(messages=ASK, tools=TOOLS, tool_choice="none", **SHORT)
    assert none.choices[0].message.tool_calls is None
    shaped = openai.chat.completions.create(
        messages=ASK, tools=TOOLS, response_format={"type": "json_object"}, **SHORT)
    assert shaped.choices[0].message.tool_calls is None


def test_a_responses_request_gets_a_function_call(forcing):
    response = openai_client(forcing).responses.create(
        model=MODEL, input="Say hello to me.", temperature=0, max_output_tokens=40,
        tools=[{"type": "function", "name": "get_weather", "parameters": WEATHER}])
    (call,) = [item for item in response.output if item.type == "function_call"]
    assert call.name == "get_weather"
    jsonschema.validate(json.loads(call.arguments), WEATHER)


def test_a_messages_request_gets_a_tool_use_and_its_result_an_answer(forcing):
    claude = Anthropic(base_url=forcing.url, api_key="unused", max_retries=0, timeout=60)
    tools = [{"name": "get_weather", "description": "A city's weather", "input_schema": WEATHER}]
    asked = [{"role": "user", "content": "Say hello to me."}]
    first = claude.messages.create(model=MODEL, max_tokens=40, messages=asked, tools=tools,
                                   extra_body={"temperature": 0})
    assert first.stop_reason == "tool_use"
    (use,) = [block for block in first.content if block.type == "tool_use"]
    jsonschema.validate(use.input, WEATHER)
    answered = [*asked, {"role": "assistant", "content": first.content},
                {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use.id,
                                              "content": "Sunny, 21 C"}]}]
    second = claude.messages.create(model=MODEL, max_tokens=40, messages=answered, tools=tools,
                                    tool_choice={"type": "none"},
                                    extra_body={"temperature": 0})
    assert second.stop_reason in ("end_turn", "max_tokens")
    assert [block.type for block in second.content] == ["text"]
