"""A gpt-oss (harmony) model in this process: its analysis channel reaches the window as
thinking, apart from the answer of its final channel, and the engine is asked to keep the frame
tokens it is read by (pagoda/engine/parsers/harmony.py)."""

import asyncio

from pagoda.app.backends import ChatMessage, SamplingOptions
from pagoda.app.backends.chat.local import LocalBackend
from tests.app.qt.fake_engine import FakeEngine, FakeTokenizer
from tests.engine.harmony_chat import HARMONY_TEMPLATE

# As gpt-oss streams it, the frame's special tokens arriving whole.
DELTAS = ["<|channel|>", "analysis", "<|message|>", "Two plus", " three.", "<|end|>",
          "<|start|>", "assistant", "<|channel|>", "final", "<|message|>", "It is", " 5."]


class HarmonyTokenizer(FakeTokenizer):
    chat_template = HARMONY_TEMPLATE


class RecordingEngine(FakeEngine):
    """Notes the sampling each reply is asked for."""

    def __init__(self) -> None:
        super().__init__("gpt-oss-test", HarmonyTokenizer())
        self.params = []

    async def stream(self, prompt, params, request_id, cache_tag=None, images=()):
        self.params.append(params)
        async for out in super().stream(prompt, params, request_id, cache_tag, images):
            yield out


def test_a_harmony_models_analysis_shows_as_thinking_apart_from_its_answer() -> None:
    engine = RecordingEngine()
    backend = LocalBackend(engine)

    async def run() -> list:
        replies = backend.stream([ChatMessage("user", "2 + 3?")], SamplingOptions(), "r1")
        first = asyncio.ensure_future(anext(replies))
        while not engine.params:
            await asyncio.sleep(0.001)
        for delta in DELTAS:
            engine.say("r1", delta)
        engine.say("r1", "", "stop")
        chunks = [await first]
        chunks += [chunk async for chunk in replies]
        return chunks

    chunks = asyncio.run(run())
    assert engine.params[0].skip_special_tokens is False
    assert "".join(c.delta_reasoning for c in chunks) == "Two plus three."
    assert "".join(c.delta_text for c in chunks) == "It is 5."
    assert (chunks[-1].reasoning, chunks[-1].text) == ("Two plus three.", "It is 5.")
    thinking_ends = max(i for i, c in enumerate(chunks) if c.delta_reasoning)
    assert all(not c.delta_text for c in chunks[:thinking_ends + 1])  # thinking first, live
