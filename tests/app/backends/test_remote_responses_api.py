"""The window's remote backend over a server that offers only OpenAI's Responses API: Pagoda's
own server with its chat completions route taken away. The backend finds that out on its first
chat and sends every chat to POST /v1/responses from then on: text, tool calls both ways,
structured replies, the counts, and what the API cannot carry refused in words."""

from __future__ import annotations

import json

import pytest
from conftest import SERVED_NAME, remote, run

from pagoda.app.backends import (
    ChatMessage,
    InvalidRequestError,
    ModelNotFoundError,
    ReplyFormat,
    SamplingOptions,
    ToolSpec,
)
from pagoda.engine.server.api import build_app
from pagoda.engine.server.runner import ServerThread
from pagoda.engine.server.served import ServedModel

CHAT = [ChatMessage("system", "You are terse."), ChatMessage("user", "What is the capital of France?")]
GREEDY = SamplingOptions(temperature=0.0, max_tokens=24)
WEATHER = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
TOOLS = (ToolSpec("get_weather", "A city's weather", WEATHER),)


def _without(paths: set[str], served: ServedModel) -> ServerThread:
    app = build_app(lambda: served)
    app.router.routes[:] = [r for r in app.router.routes if getattr(r, "path", None) not in paths]
    return ServerThread(app).start()


@pytest.fixture(scope="module")
def served(pagoda_engine) -> ServedModel:
    return ServedModel(SERVED_NAME, pagoda_engine, pagoda_engine.engine.max_model_len)


@pytest.fixture(scope="module")
def responses_only(served):
    server = _without({"/v1/chat/completions"}, served)
    yield f"{server.url}/v1"
    server.stop()


async def _reply(backend, messages=CHAT, options=GREEDY):
    return [chunk async for chunk in backend.stream(messages, options)]


def test_a_server_with_only_the_responses_api_is_answered_through_it(responses_only):
    backend = remote(responses_only)
    chunks = run(_reply(backend))
    last = chunks[-1]
    assert backend.api == "responses"
    assert "Paris" in last.text and last.finish_reason == "stop"
    assert "".join(c.delta_text for c in chunks) == last.text
    assert last.num_prompt_tokens > 0 and 0 < last.num_output_tokens <= 24
    assert len(chunks) > 2  # streamed, not given whole


def test_the_same_reply_comes_through_either_api(responses_only, pagoda_server):
    through_chat = run(_reply(remote(f"{pagoda_server.url}/v1")))[-1]
    through_responses = run(_reply(remote(responses_only, api="responses")))[-1]
    assert through_responses.text == through_chat.text
    assert through_responses.num_output_tokens == through_chat.num_output_tokens


def test_max_tokens_ends_the_reply_as_length(responses_only):
    last = run(_reply(remote(responses_only), options=SamplingOptions(temperature=0.0,
                                                                      max_tokens=3)))[-1]
    assert last.finish_reason == "length" and last.num_output_tokens == 3


def test_a_tool_call_and_its_result_go_both_ways(responses_only):
    backend = remote(responses_only)
    ask = [ChatMessage("user", "What is the weather in Paris?")]
    options = SamplingOptions(temperature=0.0, max_tokens=40, tools=TOOLS,
                              tool_choice="get_weather")
    last = run(_reply(backend, ask, options))[-1]
    assert last.finish_reason == "tool_calls"
    (call,) = last.tool_calls
    assert call.name == "get_weather" and json.loads(call.arguments).get("city")
    answered = [*ask, ChatMessage("assistant", "", tool_calls=(call,)),
                ChatMessage("tool", '{"temperature_c": 21}', tool_call_id=call.id)]
    reply = run(_reply(backend, answered, SamplingOptions(temperature=0.0, max_tokens=30,
                                                          tools=TOOLS)))[-1]
    assert reply.finish_reason in ("stop", "length") and reply.text


def test_a_structured_reply_fits_its_schema(responses_only):
    schema = {"type": "object", "properties": {"capital": {"type": "string"}},
              "required": ["capital"], "additionalProperties": False}
    options = SamplingOptions(temperature=0.0, max_tokens=30,
                              reply_format=ReplyFormat(schema, "capital"))
    last = run(_reply(remote(responses_only), options=options))[-1]
    assert set(json.loads(last.text)) == {"capital"}


@pytest.mark.parametrize(("options", "named"), [
    (SamplingOptions(stop=("\n",)), "stop sequences"),
    (SamplingOptions(seed=7), "a seed"),
    (SamplingOptions(enable_thinking=False), "the thinking switch"),
])
def test_what_the_responses_api_cannot_carry_is_refused_in_words(responses_only, options,
                                                                  named):
    with pytest.raises(InvalidRequestError, match=f"Responses API.*{named}"):
        run(_reply(remote(responses_only, api="responses"), options=options))


def test_continuing_a_reply_is_refused_over_the_responses_api(responses_only):
    backend = remote(responses_only, api="responses")
    messages = [*CHAT, ChatMessage("assistant", "The capital")]

    async def go():
        return [c async for c in backend.stream(messages, GREEDY, continue_final_message=True)]
    with pytest.raises(InvalidRequestError, match="cannot continue"):
        run(go())


def test_a_server_with_neither_api_keeps_the_not_found_error(served):
    server = _without({"/v1/chat/completions", "/v1/responses"}, served)
    try:
        backend = remote(f"{server.url}/v1")
        with pytest.raises(ModelNotFoundError, match="404"):
            run(_reply(backend))
        assert backend.api == "chat"
    finally:
        server.stop()


def test_a_server_with_chat_completions_keeps_them(pagoda_server):
    backend = remote(f"{pagoda_server.url}/v1")
    run(_reply(backend))
    assert backend.api == "chat"
