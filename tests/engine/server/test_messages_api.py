"""POST /v1/messages and /v1/messages/count_tokens through the real anthropic client against the
real server: text, the SDK's stream, a forced tool_use and its tool_result, stop sequences,
token counts, every streamed event against the SDK's types, Anthropic's error shape, the x-api-key
header, and what is refused."""

from __future__ import annotations

import json

import anthropic
import httpx
import pytest
from anthropic import Anthropic, AuthenticationError, BadRequestError, NotFoundError
from anthropic.types import Message, RawMessageStreamEvent
from pydantic import TypeAdapter

from pagoda.engine.server.api import ServerSettings
from tests.engine.server.conftest import MODEL

# This SDK has no temperature argument: it goes in the body as the API still takes it.
SHORT = {"model": MODEL, "max_tokens": 12, "extra_body": {"temperature": 0}}
WEATHER = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"],
           "additionalProperties": False}
TOOLS = [{"name": "get_weather", "description": "A city's weather", "input_schema": WEATHER}]
ASK = [{"role": "user", "content": "Name three colours."}]
KEY = "sk-test-messages-0123"


def connect(server, key: str = "unused") -> Anthropic:
    return Anthropic(base_url=server.url, api_key=key, max_retries=0, timeout=60)


@pytest.fixture(scope="module")
def claude(server) -> Anthropic:
    return connect(server)


def text_of(message: Message) -> str:
    return "".join(block.text for block in message.content if block.type == "text")


def blocks(message: Message) -> list[dict]:
    """The content as sent (the stream's snapshot adds parsed_output, and older SDKs an empty
    citations, to each block)."""
    return [{k: v for k, v in block.to_dict().items() if k != "parsed_output" and v is not None}
            for block in message.content]


def test_a_text_reply_is_one_text_block_with_its_usage(claude):
    message = claude.messages.create(messages=ASK, system="Answer briefly.", **SHORT)
    assert message.id.startswith("msg_") and message.type == "message"
    assert message.role == "assistant" and message.model == MODEL
    (block,) = message.content
    assert block.type == "text" and block.text
    assert message.stop_reason in ("end_turn", "max_tokens") and message.stop_sequence is None
    assert 0 < message.usage.output_tokens <= 12 and message.usage.input_tokens > 0


def test_a_reply_cut_by_max_tokens_says_so(claude):
    message = claude.messages.create(
        messages=[{"role": "user", "content": "Tell me a long story about a dragon."}],
        **{**SHORT, "max_tokens": 4})
    assert message.stop_reason == "max_tokens" and message.usage.output_tokens == 4


def test_the_sdk_stream_assembles_the_same_message_as_the_whole_reply(claude):
    whole = claude.messages.create(messages=ASK, **SHORT)
    with claude.messages.stream(messages=ASK, **SHORT) as stream:
        pieces = list(stream.text_stream)
        final = stream.get_final_message()
    assert len(pieces) > 1 and "".join(pieces) == text_of(whole)
    assert blocks(final) == blocks(whole) and final.stop_reason == whole.stop_reason
    assert final.usage.output_tokens == whole.usage.output_tokens
    assert final.usage.input_tokens + final.usage.cache_read_input_tokens == \
        whole.usage.input_tokens + whole.usage.cache_read_input_tokens


def test_streamed_events_come_in_anthropics_order(claude):
    kinds = [event.type for event in claude.messages.create(messages=ASK, stream=True, **SHORT)]
    assert kinds[:2] == ["message_start", "content_block_start"]
    assert set(kinds[2:-3]) == {"content_block_delta"}
    assert kinds[-3:] == ["content_block_stop", "message_delta", "message_stop"]


def test_a_forced_tool_use_and_its_result_make_a_round_trip(claude):
    ask = [{"role": "user", "content": "What is the weather in Paris?"}]
    first = claude.messages.create(messages=ask, tools=TOOLS,
                                   tool_choice={"type": "tool", "name": "get_weather"},
                                   **{**SHORT, "max_tokens": 24})
    (call,) = first.content
    assert call.type == "tool_use" and call.name == "get_weather" and call.id
    assert first.stop_reason == "tool_use" and isinstance(call.input["city"], str)
    with claude.messages.stream(messages=ask, tools=TOOLS,
                                tool_choice={"type": "tool", "name": "get_weather"},
                                **{**SHORT, "max_tokens": 24}) as stream:
        assert stream.get_final_message().content[0].input == call.input
    reply = claude.messages.create(
        messages=[*ask, {"role": "assistant", "content": first.content},
                  {"role": "user", "content": [
                      {"type": "tool_result", "tool_use_id": call.id, "content": "Sunny, 21 C"},
                      {"type": "text", "text": "Answer in one sentence."}]}],
        tools=TOOLS, **SHORT)
    assert reply.content[0].type == "text" and text_of(reply)


def test_tool_choice_any_calls_one_of_the_tools(claude):
    message = claude.messages.create(
        messages=[{"role": "user", "content": "Weather in Rome?"}], tools=TOOLS,
        tool_choice={"type": "any", "disable_parallel_tool_use": True},
        **{**SHORT, "max_tokens": 40})
    assert [block.type for block in message.content] == ["tool_use"]
    assert message.stop_reason == "tool_use"


def test_a_stop_sequence_ends_the_reply_and_is_named(claude):
    whole = text_of(claude.messages.create(messages=ASK, **SHORT))
    stop = whole.strip()[1:3]
    message = claude.messages.create(messages=ASK, stop_sequences=[stop], **SHORT)
    assert message.stop_reason == "stop_sequence" and message.stop_sequence == stop
    assert stop not in text_of(message)


def test_count_tokens_counts_the_prompt_the_reply_reads(claude):
    ask = {"messages": [{"role": "user", "content": "What is the weather in Oslo?"}],
           "system": [{"type": "text", "text": "Be brief."}], "tools": TOOLS}
    counted = claude.messages.count_tokens(model=MODEL, **ask)
    message = claude.messages.create(**ask, **SHORT)
    usage = message.usage
    assert counted.input_tokens == usage.input_tokens + usage.cache_read_input_tokens
    assert claude.messages.count_tokens(model=MODEL, messages=ask["messages"]).input_tokens < \
        counted.input_tokens  # the tools and the system prompt are counted


def test_a_bad_request_is_a_400_in_anthropics_error_shape(server):
    answer = httpx.post(f"{server.url}/v1/messages", json={"model": MODEL, "messages": ASK},
                        timeout=30)
    assert answer.status_code == 400
    body = answer.json()
    assert body["type"] == "error" and body["error"]["type"] == "invalid_request_error"
    assert "max_tokens" in body["error"]["message"]


def test_an_unknown_model_is_a_not_found_error(claude):
    with pytest.raises(NotFoundError) as caught:
        claude.messages.create(messages=ASK, **{**SHORT, "model": "claude-opus"})
    assert caught.value.body["error"]["type"] == "not_found_error"


@pytest.mark.parametrize(("extra", "named"), [
    ({"messages": [{"role": "user", "content": [
        {"type": "image", "source": {"type": "url", "url": "https://example.com/a.png"}}]}]},
     "messages[0].content[0].type"),
    ({"extra_body": {"service_tier": "priority"}}, "service_tier"),
    ({"extra_body": {"mcp_servers": [{"type": "url", "url": "https://example.com",
                                      "name": "x"}]}}, "mcp_servers"),
    ({"thinking": {"type": "enabled", "budget_tokens": 1024}}, "thinking"),
    ({"tools": [{"type": "web_search_20250305", "name": "web_search", "input_schema": {}}]},
     "tools[0].type"),
    ({"extra_body": {"top_logprobs": 2}}, "top_logprobs"),
    ({"thinking": {"type": "between_tools"}}, "thinking.type"),
    ({"messages": [{"role": "tool", "content": "x"}]}, "messages[0].role"),
    ({"thinking": {"type": "adaptive", "display": "full"}}, "thinking.display"),
    ({"extra_body": {"output_config": {"effort": "low"}}}, "output_config.effort"),
    ({"extra_body": {"output_config": {"format": {"type": "json_schema"}}}},
     "output_config.format"),
    ({"extra_body": {"context_management": {"edits": [{"type": "clear_tool_uses_20250919"}]}}},
     "context_management.edits[0].type"),
    ({"messages": [ASK[0], {"role": "assistant", "content": [
        {"type": "thinking", "thinking": "Hm.", "signature": ""},
        {"type": "text", "text": "Red."}]}, ASK[0]],
      "extra_body": {"context_management": {"edits": [
          {"type": "clear_thinking_20251015", "keep": "all"}]}}}, "context_management"),
    ({"messages": [ASK[0], {"role": "system", "content": [{"type": "image"}]}]},
     "messages[1].content[0].type"),
    ({"stop_sequences": [""]}, "stop_sequences"),
    ({"messages": [{"role": "user", "content": [
        {"type": "text", "text": "Hi", "cache_control": {"type": "persistent"}}]}]},
     "messages[0].content[0].cache_control.type"),
    ({"tools": [{**TOOLS[0], "cache_control": {"type": "persistent"}}]},
     "tools[0].cache_control.type"),
])
def test_what_this_server_cannot_do_is_refused_naming_it(claude, extra, named):
    with pytest.raises(BadRequestError) as caught:
        claude.messages.create(**{"messages": ASK, **SHORT, "max_tokens": 2000, **extra})
    error = caught.value.body["error"]
    assert error["type"] == "invalid_request_error" and named in error["message"]


def test_cache_control_and_earlier_thinking_are_read_and_the_reply_goes_on(claude):
    message = claude.messages.create(messages=[
        {"role": "user", "content": [{"type": "text", "text": "Hi",
                                      "cache_control": {"type": "ephemeral"}}]},
        {"role": "assistant", "content": [
            {"type": "thinking", "thinking": "Greet back.", "signature": ""},
            {"type": "text", "text": "Hello!"}]},
        {"role": "user", "content": "Name a colour."}], metadata={"user_id": "u-1"},
        system=[{"type": "text", "text": "Be brief.", "cache_control": {"type": "ephemeral"}}],
        **{**SHORT, "extra_body": {"temperature": 0, "cache_control": {"type": "ephemeral"}}})
    assert text_of(message)


def test_a_system_message_within_the_conversation_reaches_the_prompt(claude):
    """Claude Code (2.1.332) sends its environment as a system message after the user's."""
    environment = {"role": "system", "content": [
        {"type": "text", "text": "Primary working directory: /tmp/work. Platform: linux.",
         "cache_control": {"type": "ephemeral"}}]}
    with_it = [ASK[0], environment]
    counted = claude.messages.count_tokens(model=MODEL, messages=with_it).input_tokens
    assert counted > claude.messages.count_tokens(model=MODEL, messages=ASK).input_tokens + 10
    assert text_of(claude.messages.create(messages=with_it, **SHORT))


def test_claude_codes_default_request_is_answered_by_a_model_without_reasoning(claude):
    """Claude Code (2.1.332) asks any model it does not know for adaptive thinking shown as
    'omitted', to clear earlier thinking and for the default effort: a model that cannot think
    answers without thinking, and there is no thinking to clear."""
    message = claude.messages.create(
        messages=ASK, thinking={"type": "adaptive", "display": "omitted"}, **{**SHORT,
        "extra_body": {"temperature": 0, "output_config": {"effort": "high"},
                       "context_management": {"edits": [
                           {"type": "clear_thinking_20251015", "keep": "all"}]}}})
    assert [block.type for block in message.content] == ["text"]
    plain = claude.messages.create(messages=ASK, **SHORT)
    assert text_of(message) == text_of(plain)


def test_the_key_is_read_from_x_api_key_and_a_wrong_one_is_refused(start_server):
    server = start_server(ServerSettings(api_key=KEY))
    counted = connect(server, KEY).messages.count_tokens(model=MODEL, messages=ASK)
    assert counted.input_tokens > 0
    with pytest.raises(AuthenticationError) as caught:
        connect(server, "sk-wrong").messages.count_tokens(model=MODEL, messages=ASK)
    assert caught.value.body["error"]["type"] == "authentication_error"
    assert anthropic.__version__  # the client that sent x-api-key


def test_a_final_assistant_message_is_a_reply_the_model_goes_on_with(claude):
    whole = text_of(claude.messages.create(messages=ASK, **{**SHORT, "max_tokens": 16}))
    begun = whole[:whole.index(":") + 1]  # "1. Red:", the reply's first tokens
    went_on = claude.messages.create(
        messages=[*ASK, {"role": "assistant", "content": begun}], **SHORT)
    assert (begun + text_of(went_on)).startswith(whole[:len(begun) + 12])


def raw_events(server, body: dict) -> list[tuple[str, dict]]:
    """The stream's (event name, data) pairs, read as sent."""
    with httpx.stream("POST", f"{server.url}/v1/messages", json={**body, "stream": True},
                      headers={"anthropic-version": "2023-06-01"}, timeout=60) as answer:
        frames = answer.read().decode().strip().split("\n\n")
    pairs = []
    for frame in frames:
        name, data = frame.split("\n")
        pairs.append((name.removeprefix("event: "), json.loads(data.removeprefix("data: "))))
    return pairs


@pytest.mark.parametrize("extra", [{}, {"tools": TOOLS, "tool_choice": {"type": "any"}}])
def test_every_streamed_event_validates_as_the_sdks_type_and_is_named_by_it(server, extra):
    body = {"model": MODEL, "max_tokens": 24, "temperature": 0,
            "messages": [{"role": "user", "content": "Weather in Lima?"}], **extra}
    events = raw_events(server, body)
    adapter = TypeAdapter(RawMessageStreamEvent)
    for name, data in events:
        assert name == data["type"]
        adapter.validate_python(data, strict=False)
    Message.model_validate(events[0][1]["message"])
    whole = httpx.post(f"{server.url}/v1/messages", json=body, timeout=60).json()
    Message.model_validate(whole)
    assert events[-2][1]["delta"]["stop_reason"] == whole["stop_reason"]
