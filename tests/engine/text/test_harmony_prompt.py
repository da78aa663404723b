"""A gpt-oss (harmony) chat's history as its template reads it: the reasoning before a past call
goes back as `thinking` (tests/engine/harmony_chat.py's template writes it as that call's analysis
message, as gpt-oss's does)."""

from __future__ import annotations

from pagoda.engine.text.chat_template import encode_chat
from tests.engine.harmony_chat import harmony_tokenizer


def called(content: str) -> list[dict]:
    return [
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": content, "reasoning_content": "Use the weather tool.",
         "tool_calls": [{"id": "call_1", "type": "function", "function": {
             "name": "get_weather", "arguments": '{"city": "Paris"}'}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "Sunny, 21 C"}]


def prompt(messages: list[dict]) -> str:
    tokenizer = harmony_tokenizer()
    return tokenizer.decode(encode_chat(tokenizer, messages), skip_special_tokens=False)


def test_the_reasoning_before_a_past_call_reaches_the_template_as_thinking():
    assert ("<|start|>assistant<|channel|>analysis<|message|>Use the weather tool.<|end|>"
            "<|start|>assistant to=functions.get_weather") in prompt(called(""))


def test_a_past_call_that_came_with_text_keeps_its_text_alone():
    # gpt-oss's template refuses a call message with both content and thinking.
    assert "Use the weather tool." not in prompt(called("Let me check."))
