"""Tools, tool results and reply formats, proved alike by the engine in this process and by
Pagoda's own server on 127.0.0.1: the tools reach the prompt, a named function is called with
arguments that fit its schema, a JSON schema shapes the reply, a tool's result is answered, and
settings that cannot be followed are refused in words."""

import json

import jsonschema
import pytest
from conftest import remote, run

from pagoda.app.backends import (
    ChatBackend,
    ChatMessage,
    InvalidRequestError,
    ReplyChunk,
    ReplyFormat,
    SamplingOptions,
    ToolCallRecord,
    ToolSpec,
)

CITY = {"type": "object", "additionalProperties": False, "required": ["city"],
        "properties": {"city": {"type": "string", "enum": ["Paris", "Tokyo", "Lima"]}}}
TOOLS = (ToolSpec("get_weather", "A city's weather", CITY),
         ToolSpec("get_time", "A city's time", CITY))
ASK = [ChatMessage("user", "What is the weather in Paris?")]
ANSWERED = [*ASK,
            ChatMessage("assistant", "", tool_calls=(
                ToolCallRecord("call_1", "get_weather", '{"city": "Paris"}'),)),
            ChatMessage("tool", '{"temperature_c": 21, "sky": "sunny"}', tool_call_id="call_1")]
YES_NO = {"type": "object", "additionalProperties": False, "required": ["answer"],
          "properties": {"answer": {"type": "string", "enum": ["yes", "no"]}}}


def options(max_tokens: int = 4, **kwargs) -> SamplingOptions:
    return SamplingOptions(temperature=0.0, max_tokens=max_tokens, **kwargs)


@pytest.fixture(params=["local", "pagoda-server"])
def backend(request) -> ChatBackend:
    if request.param == "local":
        return request.getfixturevalue("local_backend")
    return remote(f"{request.getfixturevalue('pagoda_server').url}/v1")


async def collect(backend: ChatBackend, messages, opts: SamplingOptions) -> list[ReplyChunk]:
    return [chunk async for chunk in backend.stream(messages, opts)]


def reply(backend: ChatBackend, messages, opts: SamplingOptions) -> ReplyChunk:
    return run(collect(backend, messages, opts))[-1]


def test_tools_reach_the_prompt_unless_tool_choice_is_none(backend):
    plain = reply(backend, ASK, options(1)).num_prompt_tokens
    offered = reply(backend, ASK, options(1, tools=TOOLS)).num_prompt_tokens
    refused = reply(backend, ASK, options(1, tools=TOOLS, tool_choice="none")).num_prompt_tokens
    assert offered > plain + 50  # two signatures and the instructions to call them
    assert refused == plain


def test_named_tool_choice_calls_that_function_with_arguments_that_fit_its_schema(backend):
    chunks = run(collect(backend, ASK, options(20, tools=TOOLS, tool_choice="get_time")))
    last = chunks[-1]
    assert last.finish_reason == "tool_calls"
    (call,) = last.tool_calls
    assert call.name == "get_time" and call.id.startswith("call_")
    jsonschema.validate(json.loads(call.arguments), CITY)
    assert last.text == "" and all(c.delta_text == "" for c in chunks)


def test_json_schema_reply_format_gives_json_that_fits_it(backend):
    last = reply(backend, [ChatMessage("user", "Is Paris in France?")],
                 options(30, reply_format=ReplyFormat(YES_NO, "yes_no")))
    assert last.finish_reason == "stop"
    jsonschema.validate(json.loads(last.text), YES_NO)
    assert last.tool_calls == ()


def test_a_tool_result_is_read_and_answered(backend):
    without_result = reply(backend, ANSWERED[:2], options(1, tools=TOOLS))
    last = reply(backend, ANSWERED, options(6, tools=TOOLS))
    assert last.finished and last.text and last.num_output_tokens > 0
    assert last.num_prompt_tokens > without_result.num_prompt_tokens + 10


def test_local_engine_and_pagoda_server_read_a_tool_conversation_alike(local_backend,
                                                                      pagoda_server):
    opts = options(6, tools=TOOLS)
    local = reply(local_backend, ANSWERED, opts)
    served = reply(remote(f"{pagoda_server.url}/v1"), ANSWERED, opts)
    assert (served.num_prompt_tokens, served.text) == (local.num_prompt_tokens, local.text)


def test_a_schema_that_cannot_be_followed_is_refused_naming_the_reply_format(backend):
    broken = ReplyFormat({"type": "nonsense"})
    with pytest.raises(InvalidRequestError, match="reply format") as caught:
        run(collect(backend, ASK, options(reply_format=broken)))
    assert "nonsense" in str(caught.value)


@pytest.mark.parametrize(("opts", "words"), [
    (options(tools=TOOLS, tool_choice="get_weather", reply_format=ReplyFormat(YES_NO)),
     "both shape the whole reply"),
    (options(tools=TOOLS, tool_choice="get_news"), "'get_news', which is not among"),
    (options(tool_choice="required"), "needs tools"),
    (options(tools=(*TOOLS, ToolSpec("get_time"))), "repeat the name 'get_time'"),
    (options(tools=(*TOOLS, ToolSpec(""))), r"tools\[2\] has no name"),
])
def test_tool_settings_that_cannot_be_followed_are_refused_in_words(backend, opts, words):
    with pytest.raises(InvalidRequestError, match=words):
        run(collect(backend, ASK, opts))


def test_a_chat_is_counted_with_its_tools_as_exactly_as_it_is_sent(backend):
    counted = run(backend.count_tokens(ASK, TOOLS))
    sent = reply(backend, ASK, options(1, tools=TOOLS)).num_prompt_tokens
    assert counted.exact and counted.n == sent > run(backend.count_tokens(ASK)).n + 50
