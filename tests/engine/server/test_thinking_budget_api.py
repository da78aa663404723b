"""A reasoning budget through the server, on the real model under a chat template that opens
`<think>` at the prompt's end (tests/engine/test_thinking_budget.py holds the engine's claims):
Anthropic's enabled thinking with its `budget_tokens`, through the real `anthropic` SDK, is a
thinking block held to the budget and then a text block; the chat endpoint's
`thinking_token_budget` (vLLM's) cuts `reasoning_content` and leaves the content to the model;
a budget with a constraint is a 400 in words."""

from __future__ import annotations

import pytest
from anthropic import Anthropic
from openai import BadRequestError, OpenAI

from pagoda.engine.async_engine import AsyncEngine
from pagoda.engine.config import EngineConfig
from pagoda.engine.llm_engine import LLMEngine
from pagoda.engine.server.api import build_app
from pagoda.engine.server.runner import ServerThread
from pagoda.engine.server.served import ServedModel
from tests.engine.test_thinking_budget import thinking_model

MODEL = "smollm2-thinking"
# Drafts from the reply's own n-grams: a small model's long reasoning repeats itself, so most
# of the 1,024 tokens Anthropic's smallest budget asks for are verified several at a time.
ENGINE = {"num_kv_blocks": 128, "num_threads": 1, "num_speculative_tokens": 4,
          "speculative_cost_model": False}
STORY = [{"role": "user", "content": "Tell me a long story about a dragon."}]


@pytest.fixture(scope="module")
def thinking_server(default_model):
    engine = AsyncEngine(engine=LLMEngine(config=EngineConfig(**ENGINE),
                                          loaded=thinking_model(default_model)))
    served = ServedModel(MODEL, engine, engine.max_model_len)
    server = ServerThread(build_app(lambda: served)).start()
    yield server
    server.stop()
    engine.shutdown()


@pytest.fixture(scope="module")
def client(thinking_server) -> OpenAI:
    return OpenAI(base_url=f"{thinking_server.url}/v1", api_key="unused", max_retries=0,
                  timeout=300)


@pytest.mark.slow  # Anthropic's least budget is 1,024 tokens: ~50 s of decoding on 2 cores
def test_enabled_thinking_is_a_thinking_block_within_its_budget_then_a_text_block(
        thinking_server, default_model):
    claude = Anthropic(base_url=thinking_server.url, api_key="unused", max_retries=0,
                       timeout=300)
    message = claude.messages.create(
        model=MODEL, max_tokens=1040, messages=STORY, extra_body={"temperature": 0},
        thinking={"type": "enabled", "budget_tokens": 1024})
    thinking, text = message.content
    assert thinking.type == "thinking" and text.type == "text" and text.text.strip()
    spent = len(default_model.tokenizer.encode(thinking.thinking, add_special_tokens=False))
    # The model would reason on (left alone it is still at it at 1,040 tokens): the budget,
    # and the line break the closing writes before `</think>`, end it.
    assert 1000 < spent <= 1024 + 1
    assert message.usage.output_tokens == 1040 and message.stop_reason == "max_tokens"


def test_the_chat_endpoints_budget_cuts_the_reasoning_and_leaves_the_answer(client):
    free = client.chat.completions.create(model=MODEL, messages=STORY, max_tokens=40,
                                          temperature=0).choices[0].message
    assert not free.content  # still reasoning at 40 tokens
    cut = client.chat.completions.create(model=MODEL, messages=STORY, max_tokens=40,
                                         temperature=0,
                                         extra_body={"thinking_token_budget": 12})
    message = cut.choices[0].message
    assert message.content and free.model_extra["reasoning_content"].startswith(
        message.model_extra["reasoning_content"].rstrip("\n"))
    assert cut.usage.completion_tokens == 40


def test_a_budget_with_a_constraint_is_a_400_naming_both(client):
    with pytest.raises(BadRequestError) as caught:
        client.chat.completions.create(
            model=MODEL, messages=STORY, max_tokens=8, response_format={"type": "json_object"},
            extra_body={"thinking_token_budget": 12})
    assert caught.value.body["param"] == "thinking_token_budget"
    assert "response_format" in caught.value.body["message"]
