"""The openai-agents SDK against the real server, on its default model path (the Responses API):
an agent calls a function tool, gets its output back and answers from it, with Runner.run and
with the streamed Runner.run_streamed (the SDK reads our typed events).

The 135M model does not call a tool on its own, so the first turn is forced (tool_choice
"required", one call); the SDK then resets tool_choice to auto and the model answers."""

from __future__ import annotations

import asyncio

import pytest

from tests.engine.server.conftest import MODEL

agents = pytest.importorskip("agents", reason="openai-agents (the test extra) is not installed")

SECRET = "PINEAPPLE"


def get_secret_word() -> str:
    """Returns today's secret word."""
    return f"The secret word is {SECRET}."


def _agent(server):
    from openai import AsyncOpenAI

    agents.set_tracing_disabled(True)  # the SDK would send traces to OpenAI
    client = AsyncOpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0,
                         timeout=120)
    settings = agents.ModelSettings(temperature=0, max_tokens=120, tool_choice="required",
                                    parallel_tool_calls=False)
    return agents.Agent(name="secret keeper", instructions="Answer in one short sentence.",
                        tools=[agents.function_tool(get_secret_word)], model_settings=settings,
                        model=agents.OpenAIResponsesModel(model=MODEL, openai_client=client))


def _assert_called_then_answered(result) -> None:
    kinds = [item.type for item in result.new_items]
    assert kinds == ["tool_call_item", "tool_call_output_item", "message_output_item"]
    assert result.new_items[0].raw_item.name == "get_secret_word"
    assert SECRET.lower() in result.final_output.lower()


def test_an_agent_calls_its_tool_and_answers_from_the_output(server):
    question = "What is today's secret word?"
    result = asyncio.run(agents.Runner.run(_agent(server), question, max_turns=3))
    _assert_called_then_answered(result)
    assert len(result.raw_responses) == 2


def test_a_streamed_agent_run_reads_the_call_and_the_answer_from_our_events(server):
    async def run():
        streamed = agents.Runner.run_streamed(_agent(server), "What is today's secret word?",
                                              max_turns=3)
        events = [event async for event in streamed.stream_events()]
        return streamed, events

    streamed, events = asyncio.run(run())
    _assert_called_then_answered(streamed)
    deltas = [e.data.delta for e in events if e.type == "raw_response_event"
              and e.data.type == "response.output_text.delta"]
    assert "".join(deltas) == streamed.final_output
