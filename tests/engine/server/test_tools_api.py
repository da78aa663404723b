"""Tools over the API, through the real openai client: the bundled model's template takes no
tools, so they reach it as a system message and its calls are read back as Hermes calls."""

from __future__ import annotations

import json

import httpx
import jsonschema
import pytest
from openai import BadRequestError

from tests.engine.server.conftest import MODEL

WEATHER = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "description": "A city's weather",
                                      "parameters": WEATHER}},
    {"type": "function", "function": {"name": "get_time", "description": "A city's time",
                                      "parameters": WEATHER}},
]
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]
NAMED = {"type": "function", "function": {"name": "get_time"}}


def _ask(client, **kw):
    kw.setdefault("temperature", 0)
    kw.setdefault("max_tokens", 60)
    kw.setdefault("tools", TOOLS)
    return client.chat.completions.create(model=MODEL, messages=ASK, **kw)


def test_a_named_function_is_called_with_arguments_that_fit_its_schema(client):
    choice = _ask(client, tool_choice=NAMED).choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content is None
    (call,) = choice.message.tool_calls
    assert call.function.name == "get_time" and call.id.startswith("call_")
    jsonschema.validate(json.loads(call.function.arguments), WEATHER)


def test_a_streamed_named_call_sends_its_arguments_in_pieces_that_join(client):
    whole = _ask(client, tool_choice=NAMED).choices[0].message.tool_calls[0]
    deltas = [c.choices[0] for c in _ask(client, tool_choice=NAMED, stream=True) if c.choices]
    calls = [d for c in deltas for d in (c.delta.tool_calls or [])]
    assert calls[0].id and calls[0].function.name == "get_time"
    assert all(d.id is None and d.function.name is None for d in calls[1:])
    assert len(calls) > 2  # the arguments came in pieces, not at the end
    assert "".join(d.function.arguments for d in calls) == whole.function.arguments
    assert deltas[-1].finish_reason == "tool_calls"


def test_required_gives_at_least_one_call_of_the_offered_functions(client):
    choice = _ask(client, tool_choice="required", temperature=1.0, seed=3).choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.tool_calls
    for call in choice.message.tool_calls:
        assert call.function.name in ("get_weather", "get_time")
        jsonschema.validate(json.loads(call.function.arguments), WEATHER)


def test_required_without_parallel_calls_gives_exactly_one(client):
    choice = _ask(client, tool_choice="required", parallel_tool_calls=False).choices[0]
    assert len(choice.message.tool_calls) == 1


def test_auto_reply_is_content_or_calls_never_a_raw_tag(client):
    for stream in (False, True):
        if stream:
            chunks = [c.choices[0] for c in _ask(client, stream=True) if c.choices]
            content = "".join(c.delta.content or "" for c in chunks)
            calls = [d for c in chunks for d in (c.delta.tool_calls or [])]
        else:
            message = _ask(client).choices[0].message
            content, calls = message.content or "", message.tool_calls or []
        assert "<tool_call>" not in content
        assert content or calls


@pytest.mark.parametrize("tool_choice", ["required", "auto",
                                         {"type": "function", "function": {"name": "f"}}])
def test_tool_choice_without_tools_is_answered_as_a_chat_without_tools(client, tool_choice):
    """LlamaIndex's structured_predict sends tool_choice "required" with no tools."""
    plain = client.chat.completions.create(model=MODEL, messages=ASK, temperature=0,
                                           max_tokens=8).choices[0]
    chosen = client.chat.completions.create(model=MODEL, messages=ASK, temperature=0,
                                            max_tokens=8, tool_choice=tool_choice).choices[0]
    assert chosen.message.tool_calls is None
    assert chosen.message.content == plain.message.content


def test_none_keeps_the_tools_out_of_the_reply(client):
    choice = _ask(client, tool_choice="none").choices[0]
    assert choice.message.tool_calls is None and choice.finish_reason in ("stop", "length")


def test_a_conversation_with_calls_and_their_results_is_answered(client):
    history = ASK + [
        {"role": "assistant", "content": None, "tool_calls": [{
            "id": "call_1", "type": "function",
            "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "Sunny, 21 C"}]
    reply = client.chat.completions.create(model=MODEL, messages=history, tools=TOOLS,
                                           temperature=0, max_tokens=12)
    assert reply.choices[0].message.content or reply.choices[0].message.tool_calls


def test_tool_results_reach_the_prompt(server):
    def count(messages) -> int:
        body = {"model": MODEL, "messages": messages, "tools": TOOLS}
        return httpx.post(f"{server.url}/tokenize", json=body, timeout=60).json()["count"]

    result = {"role": "tool", "tool_call_id": "call_1", "content": "Sunny, 21 C, light wind"}
    assert count(ASK + [result]) > count(ASK) + 5
    without_tools = httpx.post(f"{server.url}/tokenize", json={"model": MODEL, "messages": ASK},
                               timeout=60).json()["count"]
    assert count(ASK) > without_tools + 50  # the tools' system message


@pytest.mark.parametrize(("tools", "param"), [
    (TOOLS + TOOLS[:1], "tools[2].function.name"),
    ([{"type": "function", "function": {"name": ""}}], "tools[0].function.name"),
])
def test_tokenize_refuses_tools_a_chat_request_would_refuse(server, tools, param):
    body = {"model": MODEL, "messages": ASK, "tools": tools}
    reply = httpx.post(f"{server.url}/tokenize", json=body, timeout=60)
    assert reply.status_code == 400
    assert reply.json()["error"]["param"] == param


@pytest.mark.parametrize(("fields", "param"), [
    ({"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "nope"}}},
     "tool_choice.function.name"),
    ({"tools": TOOLS, "tool_choice": "sometimes"}, "tool_choice"),
    ({"tools": TOOLS + TOOLS[:1]}, "tools[2].function.name"),
    ({"tools": TOOLS, "tool_choice": "required", "response_format": {"type": "json_object"}},
     "response_format"),
    ({"functions": [{"name": "f"}]}, "functions"),
])
def test_tool_requests_that_cannot_be_honoured_are_400s_naming_the_field(client, fields, param):
    with pytest.raises(BadRequestError) as caught:
        client.chat.completions.create(model=MODEL, messages=ASK, max_tokens=2, **fields)
    assert caught.value.param == param


def test_streamed_required_calls_arrive_before_the_reply_ends(client):
    chunks = [c.choices[0] for c in _ask(client, tool_choice="required", stream=True)
              if c.choices]
    with_calls = [i for i, c in enumerate(chunks) if c.delta.tool_calls]
    assert with_calls and with_calls[0] < len(chunks) - 1
    assert chunks[-1].finish_reason == "tool_calls"


def _wide_parameters() -> dict:
    """A parameters schema of about 70,000 characters: over the bound on a constraint."""
    fields = {f"field_{i}": {"type": "string", "description": "a field " * 3} for i in range(1200)}
    return {"type": "object", "properties": fields}


@pytest.mark.parametrize(("tool_choice", "param"), [
    ("required", "tools"),
    ({"type": "function", "function": {"name": "wide"}}, "tools[0].function.parameters"),
])
def test_tool_parameters_over_the_constraint_bound_are_a_400_in_words(client, tool_choice, param):
    tools = [{"type": "function", "function": {"name": "wide", "parameters": _wide_parameters()}}]
    with pytest.raises(BadRequestError) as caught:
        client.chat.completions.create(model=MODEL, messages=ASK, max_tokens=2, tools=tools,
                                       tool_choice=tool_choice)
    assert caught.value.param == param
    assert "65,536 characters" in str(caught.value)


@pytest.mark.parametrize(("tool_choice", "param"), [
    ("required", "tools[1].function.parameters"),
    ({"type": "function", "function": {"name": "tags"}}, "tools[1].function.parameters"),
])
def test_a_parameters_keyword_a_call_could_break_is_a_400_naming_the_tool(client, tool_choice,
                                                                          param):
    tags = {"type": "object", "properties": {"tags": {
        "type": "array", "items": {"type": "string"}, "uniqueItems": True}}}
    tools = [TOOLS[0], {"type": "function", "function": {"name": "tags", "parameters": tags}}]
    with pytest.raises(BadRequestError) as caught:
        client.chat.completions.create(model=MODEL, messages=ASK, max_tokens=2, tools=tools,
                                       tool_choice=tool_choice)
    assert caught.value.param == param
    assert "keyword 'uniqueItems'" in str(caught.value)


def _with_call(arguments: str, call_type: str = "function") -> list[dict]:
    call = {"id": "call_1", "type": call_type,
            "function": {"name": "get_weather", "arguments": arguments}}
    return [*ASK, {"role": "assistant", "content": None, "tool_calls": [call]},
            {"role": "tool", "tool_call_id": "call_1", "content": "sunny"}]


def test_call_arguments_nested_100000_deep_are_a_400_naming_them(server):
    body = {"model": MODEL, "max_tokens": 2, "tools": TOOLS,
            "messages": _with_call("[" * 100_000 + "]" * 100_000)}
    reply = httpx.post(f"{server.url}/v1/chat/completions", json=body, timeout=60)
    assert reply.status_code == 400
    error = reply.json()["error"]
    assert error["param"] == "messages[1].tool_calls[0].function.arguments"
    assert "100,000 levels deep" in error["message"]


def test_tool_parameters_nested_too_deep_are_a_400_naming_them(server):
    parameters: dict = {"type": "string"}
    for _ in range(300):
        parameters = {"type": "array", "items": parameters}
    tools = [{"type": "function", "function": {"name": "deep", "parameters": parameters}}]
    reply = httpx.post(f"{server.url}/v1/chat/completions", timeout=60,
                       json={"model": MODEL, "max_tokens": 2, "tools": tools, "messages": ASK})
    assert reply.status_code == 400
    assert reply.json()["error"]["param"] == "tools[0].function.parameters"


def test_a_body_nested_60000_deep_is_a_400(server):
    # Under the bound on a body's arrays and objects (65,536), which answers 413 past it.
    body = '{"model": "' + MODEL + '", "messages": ' + "[" * 60_000 + "]" * 60_000 + "}"
    reply = httpx.post(f"{server.url}/v1/chat/completions", content=body, timeout=60,
                       headers={"content-type": "application/json"})
    assert reply.status_code == 400
    assert "too deep" in reply.json()["error"]["message"]


def test_a_call_of_a_type_openai_does_not_know_is_a_400_naming_it(client):
    with pytest.raises(BadRequestError) as caught:
        client.chat.completions.create(model=MODEL, max_tokens=2, tools=TOOLS,
                                       messages=_with_call('{"city": "Paris"}', "bogus"))
    assert caught.value.param == "messages[1].tool_calls[0].type"


def test_required_calls_end_where_the_model_writes_a_call_again(client):
    """Offered one tool, the bundled model writes its call, then the same call again: the reply
    ends after the first, rather than repeating it until max_tokens."""
    reply = _ask(client, tools=TOOLS[:1], tool_choice="required", max_tokens=200)
    choice = reply.choices[0]
    assert choice.finish_reason == "tool_calls"
    (call,) = choice.message.tool_calls
    assert call.function.name == "get_weather"
    assert json.loads(call.function.arguments) == {"city": "Paris"}


def test_a_streamed_repeat_is_never_sent(client):
    chunks = [c.choices[0] for c in _ask(client, tools=TOOLS[:1], tool_choice="required",
                                         max_tokens=200, stream=True) if c.choices]
    indexes = {call.index for c in chunks for call in c.delta.tool_calls or []}
    assert indexes == {0}
    assert chunks[-1].finish_reason == "tool_calls"
