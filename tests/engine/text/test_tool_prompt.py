"""Tools and tool calls reach a template that takes none (the bundled SmolLM2's ChatML)."""

from __future__ import annotations

import json

import pytest

from pagoda.engine.text.chat_template import encode_chat

TOOL = {"type": "function", "function": {"name": "get_weather", "description": "A city's weather",
                                         "parameters": {"type": "object"}}}
CALLED = [
    {"role": "user", "content": "Weather in Paris?"},
    {"role": "assistant", "content": "", "tool_calls": [{
        "id": "call_1", "type": "function",
        "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]},
    {"role": "tool", "tool_call_id": "call_1", "content": "Sunny, 21 C"},
]


@pytest.fixture(scope="module")
def tokenizer(default_model):
    return default_model.tokenizer


def _prompt(tokenizer, messages, tools=None) -> str:
    return tokenizer.decode(encode_chat(tokenizer, messages, tools=tools))


def test_offered_tools_are_described_in_a_system_message(tokenizer):
    prompt = _prompt(tokenizer, CALLED[:1], [TOOL])
    assert json.dumps(TOOL) in prompt and "<tool_call>" in prompt


def test_calls_and_results_in_the_history_are_written_without_tools_offered(tokenizer):
    prompt = _prompt(tokenizer, CALLED)
    assert '{"name": "get_weather", "arguments": {"city": "Paris"}}' in prompt
    assert "<tool_response>\nSunny, 21 C\n</tool_response>" in prompt
    assert "get_weather\", \"description\"" not in prompt  # no tools offered, none described


def test_a_chat_without_tools_is_rendered_as_before(tokenizer):
    plain = [{"role": "user", "content": "Hi"}]
    assert encode_chat(tokenizer, plain) == tokenizer.apply_chat_template(
        plain, add_generation_prompt=True, tokenize=True, return_dict=False)
