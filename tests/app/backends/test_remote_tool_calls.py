"""What OpenAIBackend sends of a chat's tools, tool results and reply format, and how it reads
back the reasoning and tool calls of the chunks servers send: vLLM's and Pagoda's calls in
pieces by index, parallel calls, Ollama's whole calls and its `reasoning`, a refusal of a
field the server does not take."""

import json

import pytest
from conftest import remote, run
from hypothesis import given, settings
from hypothesis import strategies as st

from pagoda.app.backends import (
    ChatMessage,
    InvalidRequestError,
    MalformedStreamError,
    ReplyChunk,
    ReplyFormat,
    SamplingOptions,
    ToolCallRecord,
    ToolSpec,
)
from pagoda.app.backends.remote.openai_stream import ReplyReader

CITY = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
TOOLS = (ToolSpec("get_weather", "A city's weather", CITY), ToolSpec("get_time"))
CHAT = [ChatMessage("user", "Weather and time in Paris?")]
OPTIONS = SamplingOptions(temperature=0.0, max_tokens=50, tools=TOOLS)
USAGE = {"choices": [], "usage": {"prompt_tokens": 20, "completion_tokens": 9,
                                  "total_tokens": 29}}


def call_start(index: int, call_id: str, name: str) -> dict:
    """vLLM's first delta of a call: its id and name, no arguments yet."""
    return {"delta": {"tool_calls": [{"index": index, "id": call_id, "type": "function",
                                      "function": {"name": name, "arguments": ""}}]}}


def arguments(index: int, piece: str) -> dict:
    return {"delta": {"tool_calls": [{"index": index, "function": {"arguments": piece}}]}}


FINISH_WITH_CALLS = {"delta": {}, "finish_reason": "tool_calls"}
# vLLM (hermes parser) calling get_weather, its arguments cut where the tokens fall.
SPLIT_CALL = [call_start(0, "chatcmpl-tool-1", "get_weather"), arguments(0, '{"ci'),
              arguments(0, 'ty": "Par'), arguments(0, 'is"}'), FINISH_WITH_CALLS, USAGE]
# Two calls in one reply, the second begun in the same chunk that ends the first.
PARALLEL_CALLS = [
    call_start(0, "call_a", "get_weather"), arguments(0, '{"city": '),
    {"delta": {"tool_calls": [{"index": 0, "function": {"arguments": '"Paris"}'}},
                              {"index": 1, "id": "call_b", "type": "function",
                               "function": {"name": "get_time", "arguments": "{}"}}]}},
    FINISH_WITH_CALLS, USAGE]
# DeepSeek-R1 on vLLM: the thinking first, then the answer.
REASONING_THEN_CONTENT = [
    {"delta": {"reasoning_content": "The user wants"}},
    {"delta": {"reasoning_content": " a greeting."}},
    {"delta": {"content": "Hello"}}, {"delta": {"content": "!"}, "finish_reason": "stop"}, USAGE]
# Ollama: `reasoning`, then whole calls with no index, finished as "stop".
OLLAMA = [
    {"delta": {"role": "assistant", "content": "", "reasoning": "Need the weather."}},
    {"delta": {"role": "assistant", "content": "", "tool_calls": [
        {"id": "call_x1", "type": "function",
         "function": {"name": "get_weather", "arguments": '{"city":"Paris"}'}},
        {"id": "call_x2", "type": "function", "function": {"name": "get_time",
                                                           "arguments": {"city": "Paris"}}}]}},
    {"delta": {"role": "assistant", "content": ""}, "finish_reason": "stop"}, USAGE]
WEATHER_CALL = ToolCallRecord("chatcmpl-tool-1", "get_weather", '{"city": "Paris"}')


def stream_script(fake_vllm, script: list[dict], options=OPTIONS,
                  messages=CHAT) -> list[ReplyChunk]:
    fake, url = fake_vllm
    fake.script = script

    async def collect():
        return [chunk async for chunk in remote(url).stream(messages, options)]

    return run(collect())


def test_a_call_whose_arguments_come_in_pieces_is_put_back_together(fake_vllm):
    chunks = stream_script(fake_vllm, SPLIT_CALL)
    last = chunks[-1]
    assert last.finish_reason == "tool_calls"
    assert last.tool_calls == (WEATHER_CALL,)
    assert json.loads(last.tool_calls[0].arguments) == {"city": "Paris"}
    assert last.text == "" and last.num_output_tokens == 9


def test_a_call_being_written_is_not_given_until_it_is_complete(fake_vllm):
    chunks = stream_script(fake_vllm, SPLIT_CALL)
    assert all(c.tool_calls == () for c in chunks[:-1])


def test_parallel_calls_are_read_apart_each_given_once_complete(fake_vllm):
    chunks = stream_script(fake_vllm, PARALLEL_CALLS)
    first = ToolCallRecord("call_a", "get_weather", '{"city": "Paris"}')
    assert chunks[-1].tool_calls == (first, ToolCallRecord("call_b", "get_time", "{}"))
    assert [c.tool_calls for c in chunks[:-1]] == [(), (), (first,)]


def test_reasoning_content_is_read_apart_from_the_answer(fake_vllm):
    chunks = stream_script(fake_vllm, REASONING_THEN_CONTENT)
    last = chunks[-1]
    assert (last.reasoning, last.text) == ("The user wants a greeting.", "Hello!")
    assert "".join(c.delta_reasoning for c in chunks) == last.reasoning
    assert "".join(c.delta_text for c in chunks) == last.text
    assert last.finish_reason == "stop" and last.tool_calls == ()


def test_ollamas_reasoning_and_whole_calls_without_index_are_read(fake_vllm):
    last = stream_script(fake_vllm, OLLAMA)[-1]
    assert last.reasoning == "Need the weather."
    assert last.tool_calls == (ToolCallRecord("call_x1", "get_weather", '{"city":"Paris"}'),
                               ToolCallRecord("call_x2", "get_time", '{"city": "Paris"}'))
    assert last.finish_reason == "tool_calls"  # Ollama says "stop"


def test_reasoning_sent_under_both_names_is_read_once(fake_vllm):
    both = [{"delta": {"reasoning_content": "Hmm.", "reasoning": "Hmm."}},
            {"delta": {"content": "Hi"}, "finish_reason": "stop"}]
    assert stream_script(fake_vllm, both)[-1].reasoning == "Hmm."


def test_tool_calls_that_are_not_a_list_are_malformed_and_the_text_kept(fake_vllm):
    script = [{"delta": {"content": "Let me look."}},
              {"delta": {"tool_calls": {"name": "get_weather"}}}]
    with pytest.raises(MalformedStreamError, match="tool_calls") as caught:
        stream_script(fake_vllm, script)
    assert caught.value.partial_text == "Let me look."


def _events(script: list[dict]) -> list[str]:
    return [json.dumps({"choices": [{"index": 0, "finish_reason": None, **item}]})
            for item in script]


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(min_value=1, max_value=40), min_size=1, max_size=12),
       st.lists(st.integers(min_value=1, max_value=40), min_size=1, max_size=12))
def test_calls_split_anywhere_are_read_the_same(cuts_a, cuts_b):
    whole_a, whole_b = '{"city": "Paris", "units": "celsius"}', '{"city": "Tokyo"}'
    script = [call_start(0, "call_a", "get_weather")]
    script += [arguments(0, piece) for piece in _cut(whole_a, cuts_a)]
    script += [call_start(1, "call_b", "get_time")]
    script += [arguments(1, piece) for piece in _cut(whole_b, cuts_b)]
    reader = ReplyReader("http://test/v1", 0.0)
    for data in _events([*script, FINISH_WITH_CALLS]):
        reader.read(data)
    assert reader.final().tool_calls == (ToolCallRecord("call_a", "get_weather", whole_a),
                                         ToolCallRecord("call_b", "get_time", whole_b))


def _cut(text: str, sizes: list[int]) -> list[str]:
    """The text in pieces of those sizes (the last piece takes the rest)."""
    pieces, start = [], 0
    for size in sizes:
        if start >= len(text):
            break
        pieces.append(text[start:start + size])
        start += size
    return [*pieces, text[start:]] if start < len(text) else pieces


# -- what is sent --

def test_tools_and_a_named_tool_choice_are_sent_in_openais_shapes(fake_vllm):
    fake, _ = fake_vllm
    stream_script(fake_vllm, SPLIT_CALL, SamplingOptions(tools=TOOLS, tool_choice="get_time"))
    sent = fake.requests[-1]
    assert sent["tools"] == [
        {"type": "function", "function": {"name": "get_weather",
                                          "description": "A city's weather",
                                          "parameters": CITY}},
        {"type": "function", "function": {"name": "get_time"}}]
    assert sent["tool_choice"] == {"type": "function", "function": {"name": "get_time"}}
    assert "response_format" not in sent


@pytest.mark.parametrize("choice", ["auto", "none", "required"])
def test_tool_choice_modes_are_sent_as_they_are(fake_vllm, choice):
    fake, _ = fake_vllm
    stream_script(fake_vllm, SPLIT_CALL, SamplingOptions(tools=TOOLS, tool_choice=choice))
    assert fake.requests[-1]["tool_choice"] == choice


def test_no_tool_fields_are_sent_for_a_chat_without_tools(fake_vllm):
    fake, _ = fake_vllm
    stream_script(fake_vllm, REASONING_THEN_CONTENT, SamplingOptions())
    assert not {"tools", "tool_choice", "response_format"} & set(fake.requests[-1])


@pytest.mark.parametrize(("reply_format", "sent"), [
    (ReplyFormat(CITY, "city"),
     {"type": "json_schema", "json_schema": {"name": "city", "schema": CITY}}),
    (ReplyFormat(), {"type": "json_object"}),
])
def test_reply_format_is_sent_as_response_format(fake_vllm, reply_format, sent):
    fake, _ = fake_vllm
    stream_script(fake_vllm, REASONING_THEN_CONTENT, SamplingOptions(reply_format=reply_format))
    assert fake.requests[-1]["response_format"] == sent


def test_an_assistants_calls_and_a_tools_result_are_sent_in_openais_shapes(fake_vllm):
    fake, _ = fake_vllm
    messages = [*CHAT, ChatMessage("assistant", "", tool_calls=(WEATHER_CALL,)),
                ChatMessage("tool", '{"temperature_c": 21}', tool_call_id=WEATHER_CALL.id)]
    stream_script(fake_vllm, REASONING_THEN_CONTENT, messages=messages)
    assert fake.requests[-1]["messages"] == [
        {"role": "user", "content": "Weather and time in Paris?"},
        {"role": "assistant", "content": "", "tool_calls": [
            {"id": "chatcmpl-tool-1", "type": "function",
             "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]},
        {"role": "tool", "content": '{"temperature_c": 21}', "tool_call_id": "chatcmpl-tool-1"}]


# -- refusals --

@pytest.mark.parametrize(("body", "field"), [
    # vLLM started without a tool parser.
    ({"object": "error", "type": "BadRequestError", "param": None, "code": 400,
      "message": '"auto" tool choice requires --enable-auto-tool-choice and '
                 "--tool-call-parser to be set"}, "tool_choice"),
    # OpenAI's shape, the field named in `param`.
    ({"error": {"message": "Invalid schema for function 'get_weather'", "type":
                "invalid_request_error", "param": "tools[0].function.parameters",
                "code": "invalid_function_parameters"}}, "tools"),
    # llama.cpp started without --jinja.
    ({"error": {"code": 400, "message": "tools param requires --jinja flag",
                "type": "invalid_request_error"}}, "tools"),
    # Ollama, with a model whose template takes no tools.
    ({"error": "registry.ollama.ai/library/gemma:2b does not support tools"}, "tools"),
    ({"object": "error", "type": "BadRequestError", "param": None, "code": 400,
      "message": "response_format json_schema is not supported"}, "response_format"),
])
def test_a_refused_field_reaches_the_user_named_with_the_servers_words(fake_vllm, body, field):
    fake, url = fake_vllm
    fake.fault.status, fake.fault.body = 400, body

    async def collect():
        return [c async for c in remote(url).stream(CHAT, OPTIONS)]

    with pytest.raises(InvalidRequestError) as caught:
        run(collect())
    message = str(caught.value)
    assert f"refused this chat's {field} (HTTP 400" in message
    assert _said(body) in message


def test_a_refusal_of_another_field_is_not_blamed_on_the_tools(fake_vllm):
    fake, url = fake_vllm
    fake.fault.status = 400
    fake.fault.body = {"error": {"message": "top_p must be in (0, 1], got 3.0",
                                 "type": "invalid_request_error", "param": "top_p"}}

    async def collect():
        return [c async for c in remote(url).stream(CHAT, OPTIONS)]

    with pytest.raises(InvalidRequestError, match="sampling settings") as caught:
        run(collect())
    assert "tools" not in str(caught.value)


def _said(body: dict) -> str:
    error = body.get("error", body)
    return error if isinstance(error, str) else error["message"]
