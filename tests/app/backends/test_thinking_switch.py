"""The thinking switch and earlier reasoning on their way to a model: the engine in this process
renders them with the model's own template; a server gets chat_template_kwargs where it reads
them, and a request it could not follow is refused in words."""

import asyncio

import pytest

from pagoda.app.backends import ChatMessage, InvalidRequestError, SamplingOptions
from pagoda.app.backends.chat.local import LocalBackend
from pagoda.app.backends.remote.openai_request import chat_request
from tests.app.qt.fake_engine import FakeEngine, FakeTokenizer

# A small template in Qwen3's manner: reasoning is written for the turn being answered only,
# and a switched-off thinking leaves an empty think block after the generation prompt.
SWITCH_TEMPLATE = (
    "{% for m in messages %}{% if m.role == 'assistant' and m.reasoning_content and loop.last %}"
    "<think> {{ m.reasoning_content }} </think> {% endif %}{{ m.content }} {% endfor %}"
    "{% if enable_thinking is defined and not enable_thinking %}<think> </think>{% endif %}")
CHAT = [ChatMessage("user", "two plus three"),
        ChatMessage("assistant", "five", reasoning="add the two numbers")]


class SwitchTokenizer(FakeTokenizer):
    chat_template = SWITCH_TEMPLATE


class RecordingEngine(FakeEngine):
    """A fake engine whose model has the switch template; it notes each prompt's length."""

    def __init__(self) -> None:
        super().__init__("switching-model", SwitchTokenizer())
        self.prompt_lengths: list[int] = []

    async def stream(self, prompt, params, request_id, cache_tag=None, images=()):
        self.prompt_lengths.append(len(prompt))
        async for out in super().stream(prompt, params, request_id, cache_tag, images):
            yield out


def first_prompt_length(engine: RecordingEngine, backend: LocalBackend,
                        options: SamplingOptions) -> int:
    async def run() -> int:
        replies = backend.stream(CHAT, options, "r1")
        pending = asyncio.ensure_future(anext(replies))
        while not engine.prompt_lengths:
            await asyncio.sleep(0.001)
        engine.say("r1", "", "stop")
        await pending
        await replies.aclose()
        return engine.prompt_lengths.pop()
    return asyncio.run(run())


def test_the_local_template_reads_the_switch_and_the_reasoning_of_the_last_turn() -> None:
    engine = RecordingEngine()
    backend = LocalBackend(engine)
    assert backend.thinking_switch
    default = first_prompt_length(engine, backend, SamplingOptions())
    off = first_prompt_length(engine, backend, SamplingOptions(enable_thinking=False))
    assert off == default + 2  # "<think> </think>"
    without_reasoning = asyncio.run(backend.count_tokens([CHAT[0], ChatMessage("assistant",
                                                                               "five")]))
    assert default == without_reasoning.n + 6  # "<think> add the two numbers </think>"


def test_a_model_without_a_switch_refuses_one_in_words() -> None:
    backend = LocalBackend(FakeEngine("plain-model"))
    assert not backend.thinking_switch
    replies = backend.stream(CHAT, SamplingOptions(enable_thinking=True))
    with pytest.raises(InvalidRequestError, match="has no thinking switch"):
        asyncio.run(anext(replies))


@pytest.mark.parametrize("flavor", ["vllm", "sglang", "pagoda", "llama.cpp"])
def test_servers_that_read_template_kwargs_get_the_switch(flavor) -> None:
    body = chat_request("m", CHAT, SamplingOptions(enable_thinking=False), flavor)
    assert body["chat_template_kwargs"] == {"enable_thinking": False}
    assert "reasoning_content" not in body["messages"][1]


def test_a_server_with_no_field_for_the_switch_is_not_sent_one_silently() -> None:
    with pytest.raises(InvalidRequestError, match="no field for"):
        chat_request("m", CHAT, SamplingOptions(enable_thinking=True), "openai")
    assert "chat_template_kwargs" not in chat_request("m", CHAT, SamplingOptions(), "openai")
