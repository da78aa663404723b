"""A gpt-oss (harmony) model behind the chat route: its analysis channel comes back as
`reasoning_content`, its calls as `tool_calls` streamed argument by argument, its final channel
as content; `reasoning_effort` reaches its template's system message (a model whose template has
no such setting refuses it: tests/engine/server/test_api_errors.py). Behind /v1/responses the
same reply is a reasoning item, then a message or a function_call item; behind /v1/messages, a
thinking block, then a text or a tool_use block.

The harmony model is a fake backend over a small tokenizer with harmony's special tokens
(tests/engine/harmony_chat.py) that streams a scripted reply token by token: the claims are the
server's, not a model's."""

from __future__ import annotations

import json

import pytest
from anthropic import Anthropic, BadRequestError
from openai import OpenAI

from pagoda.engine.outputs import CompletionOutput, RequestMetrics, RequestOutput
from pagoda.engine.server.api import build_app
from pagoda.engine.server.runner import ServerThread
from pagoda.engine.server.served import ServedModel
from pagoda.engine.structured_output.compiler import StructuredOutputCompiler
from pagoda.engine.structured_output.vocabulary import Vocabulary
from pagoda.engine.text.chat_tokenizer import ChatTokenizer
from tests.engine.harmony_chat import HARMONY_TEMPLATE, harmony_tokenizer, stop_token_ids

ARGUMENTS = '{"location": "Tokyo", "unit": "celsius"}'
CALL_REPLY = ("<|channel|>analysis<|message|>Need the weather tool.<|end|><|start|>assistant"
              "<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>"
              + ARGUMENTS)
ANSWER_REPLY = ("<|channel|>analysis<|message|>Simple sum.<|end|><|start|>assistant"
                "<|channel|>final<|message|>2 + 2 = 4.")
TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"location": {"type": "string"},
                                     "unit": {"enum": ["celsius", "fahrenheit"]}},
    "required": ["location", "unit"]}}}]
USER = [{"role": "user", "content": "Weather in Tokyo?"}]


class HarmonyBackend:
    """Streams `reply` one token at a time as the engine would (frame tokens kept), and keeps
    each request's prompt and sampling parameters."""

    chat_template = HARMONY_TEMPLATE
    hidden_size = 8
    image_prompt = None  # text only

    def __init__(self) -> None:
        self.tokenizer = harmony_tokenizer()
        self.chat_tokenizer = ChatTokenizer(self.tokenizer, max_tokens=4096)
        self.compiler = StructuredOutputCompiler(
            Vocabulary(self.tokenizer, len(self.tokenizer), stop_token_ids()))
        self.reply = ANSWER_REPLY
        self.requests: list[tuple[str, object]] = []

    def token_text(self, token_ids: list[int]) -> str:
        return self.tokenizer.decode(token_ids, skip_special_tokens=False)

    async def stream(self, prompt, params=None, request_id=None, images=()):
        assert not images, "a text-only backend is never sent images"
        self.requests.append((self.token_text(prompt), params))
        tokens = self.tokenizer.encode(self.reply, add_special_tokens=False)
        for i, token in enumerate(tokens):
            done = i == len(tokens) - 1
            completion = CompletionOutput(
                0, self.token_text(tokens[:i + 1]), tokens[:i + 1],
                "stop" if done else None, self.token_text([token]), [token])
            yield RequestOutput(request_id, None, list(prompt), [completion], done, 0,
                                RequestMetrics(0.0))

    def abort(self, request_id: str) -> None:
        pass

    async def compile_grammar(self, params):
        return None if params.structured_outputs is None else \
            self.compiler.compile(params.structured_outputs)

    def check_health(self) -> None:
        pass


@pytest.fixture(scope="module")
def harmony():
    backend = HarmonyBackend()
    server = ServerThread(build_app(lambda: ServedModel("gpt-oss-test", backend, 4096))).start()
    yield backend, OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0,
                          timeout=60)
    server.stop()


def test_reasoning_effort_reaches_a_harmony_models_system_message(harmony):
    backend, client = harmony
    client.chat.completions.create(model="gpt-oss-test", messages=USER, reasoning_effort="high")
    prompt, _ = backend.requests[-1]
    assert "Reasoning: high" in prompt and prompt.endswith("<|start|>assistant")
    client.chat.completions.create(model="gpt-oss-test", messages=USER)
    assert "Reasoning: medium" in backend.requests[-1][0]  # the template's own default


def test_a_reasoning_effort_the_template_has_no_words_for_is_refused_naming_those_it_has(harmony):
    _, client = harmony
    with pytest.raises(Exception, match="'low', 'medium' or 'high'") as caught:
        client.chat.completions.create(model="gpt-oss-test", messages=USER,
                                       reasoning_effort="minimal")
    assert caught.value.status_code == 400


def test_the_reasoning_of_a_call_sent_back_reaches_the_template(harmony):
    """A client sends back the assistant's call with its reasoning_content (as vLLM's clients
    do): the template writes it in the call's analysis channel."""
    backend, client = harmony
    call = {"id": "call_1", "type": "function",
            "function": {"name": "get_weather", "arguments": ARGUMENTS}}
    messages = [*USER, {"role": "assistant", "content": None, "tool_calls": [call],
                        "reasoning_content": "Need the weather tool."},
                {"role": "tool", "tool_call_id": "call_1", "content": '{"temp": 21}'}]
    client.chat.completions.create(model="gpt-oss-test", messages=messages, tools=TOOLS)
    prompt, _ = backend.requests[-1]
    assert "<|channel|>analysis<|message|>Need the weather tool." in prompt


def test_a_harmony_answer_comes_back_as_reasoning_content_and_content(harmony):
    backend, client = harmony
    backend.reply = ANSWER_REPLY
    reply = client.chat.completions.create(model="gpt-oss-test", messages=USER)
    message = reply.choices[0].message
    assert message.content == "2 + 2 = 4."
    assert message.model_extra["reasoning_content"] == "Simple sum."
    assert reply.choices[0].finish_reason == "stop"
    assert backend.requests[-1][1].skip_special_tokens is False  # the frame reaches the parser


def test_a_harmony_call_streams_as_tool_call_deltas_after_its_reasoning(harmony):
    backend, client = harmony
    backend.reply = CALL_REPLY
    chunks = list(client.chat.completions.create(model="gpt-oss-test", messages=USER,
                                                 tools=TOOLS, stream=True))
    deltas = [c.choices[0].delta for c in chunks if c.choices]
    reasoning = "".join((d.model_extra or {}).get("reasoning_content") or "" for d in deltas)
    calls = [call for d in deltas for call in d.tool_calls or []]
    assert reasoning == "Need the weather tool."
    assert calls[0].id.startswith("call_") and calls[0].function.name == "get_weather"
    assert len(calls) > 2  # the arguments arrive in pieces, as they are written
    assert "".join(call.function.arguments for call in calls) == ARGUMENTS
    assert not any(d.content for d in deltas)
    assert chunks[-1].choices[0].finish_reason == "tool_calls"


def test_a_named_function_under_harmony_constrains_the_call_frame_and_reads_it_back(harmony):
    backend, client = harmony
    backend.reply = CALL_REPLY
    reply = client.chat.completions.create(
        model="gpt-oss-test", messages=USER, tools=TOOLS,
        tool_choice={"type": "function", "function": {"name": "get_weather"}})
    constraint = backend.requests[-1][1].structured_outputs
    assert constraint.kind == "structural_tag"
    frame = json.dumps(json.loads(constraint.structural_tag))
    assert "<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>" in frame
    message = reply.choices[0].message
    assert message.tool_calls[0].function.arguments == ARGUMENTS
    assert message.model_extra["reasoning_content"] == "Need the weather tool."


RESPONSES_TOOLS = [{"type": "function", "name": "get_weather",
                    "parameters": TOOLS[0]["function"]["parameters"]}]


def test_responses_reasoning_effort_reaches_the_template_as_the_chat_routes_does(harmony):
    backend, client = harmony
    backend.reply = ANSWER_REPLY
    client.responses.create(model="gpt-oss-test", input="Weather in Tokyo?",
                            reasoning={"effort": "low"})
    assert "Reasoning: low" in backend.requests[-1][0]


def test_a_harmony_answer_is_a_reasoning_item_then_a_message_in_responses(harmony):
    backend, client = harmony
    backend.reply = ANSWER_REPLY
    reasoning, message = client.responses.create(model="gpt-oss-test",
                                                 input="What is 2 + 2?").output
    assert reasoning.type == "reasoning" and reasoning.content[0].text == "Simple sum."
    assert message.type == "message" and message.content[0].text == "2 + 2 = 4."


def test_a_responses_usage_counts_the_reasoning_tokens(harmony):
    """The analysis channel's tokens, its header included, are the reasoning's."""
    backend, client = harmony
    backend.reply = ANSWER_REPLY
    before_answer = ANSWER_REPLY[:ANSWER_REPLY.index("<|end|>")]
    expected = len(backend.tokenizer.encode(before_answer, add_special_tokens=False))
    usage = client.responses.create(model="gpt-oss-test", input="What is 2 + 2?").usage
    assert usage.output_tokens_details.reasoning_tokens == expected
    assert 0 < expected < usage.output_tokens
    streamed = list(client.responses.create(model="gpt-oss-test", input="What is 2 + 2?",
                                            stream=True))
    assert streamed[-1].response.usage.output_tokens_details.reasoning_tokens == expected


def test_a_streamed_harmony_call_is_reasoning_events_then_a_function_call_item(harmony):
    backend, client = harmony
    backend.reply = CALL_REPLY
    with client.responses.stream(model="gpt-oss-test", input="Weather in Tokyo?",
                                 tools=RESPONSES_TOOLS) as stream:
        events = list(stream)
        final = stream.get_final_response()
    thought = "".join(e.delta for e in events if e.type == "response.reasoning_text.delta")
    pieces = [e.delta for e in events if e.type == "response.function_call_arguments.delta"]
    assert thought == "Need the weather tool."
    assert len(pieces) > 2 and "".join(pieces) == ARGUMENTS
    reasoning, call = final.output
    assert reasoning.type == "reasoning" and call.type == "function_call"
    assert call.name == "get_weather" and call.arguments == ARGUMENTS


MESSAGES_TOOLS = [{"name": "get_weather", "input_schema": TOOLS[0]["function"]["parameters"]}]


@pytest.fixture(scope="module")
def claude(harmony):
    _, client = harmony
    return Anthropic(base_url=str(client.base_url).removesuffix("/v1/"), api_key="unused",
                     max_retries=0, timeout=60)


def test_a_harmony_answer_is_a_thinking_block_then_a_text_block_in_messages(harmony, claude):
    backend, _ = harmony
    backend.reply = ANSWER_REPLY
    thinking, text = claude.messages.create(
        model="gpt-oss-test", max_tokens=2048, messages=USER,
        thinking={"type": "enabled", "budget_tokens": 1024}).content
    assert thinking.type == "thinking" and thinking.thinking == "Simple sum."
    assert text.type == "text" and text.text == "2 + 2 = 4."
    assert backend.requests[-1][1].thinking_token_budget == 1024  # the engine holds it


def test_a_streamed_harmony_call_is_thinking_deltas_then_a_tool_use_in_pieces(harmony, claude):
    backend, _ = harmony
    backend.reply = CALL_REPLY
    with claude.messages.stream(model="gpt-oss-test", max_tokens=256, messages=USER,
                                tools=MESSAGES_TOOLS) as stream:
        events = list(stream)
        final = stream.get_final_message()
    deltas = [e.delta for e in events if e.type == "content_block_delta"]
    thought = "".join(d.thinking for d in deltas if d.type == "thinking_delta")
    pieces = [d.partial_json for d in deltas if d.type == "input_json_delta"]
    assert thought == "Need the weather tool."
    assert len(pieces) > 2 and "".join(pieces) == ARGUMENTS
    thinking, call = final.content
    assert thinking.type == "thinking" and call.type == "tool_use"
    assert call.input == json.loads(ARGUMENTS) and final.stop_reason == "tool_use"


def test_a_harmony_models_thinking_cannot_be_disabled_and_is_refused_in_words(claude):
    with pytest.raises(BadRequestError, match="always reasons"):
        claude.messages.create(model="gpt-oss-test", max_tokens=64, messages=USER,
                               thinking={"type": "disabled"})


def test_thinking_with_a_forced_tool_is_refused_as_anthropic_refuses_it(claude):
    with pytest.raises(BadRequestError, match="forces a tool"):
        claude.messages.create(model="gpt-oss-test", max_tokens=2048, messages=USER,
                               tools=MESSAGES_TOOLS, tool_choice={"type": "any"},
                               thinking={"type": "enabled", "budget_tokens": 1024})
