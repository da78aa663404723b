"""LangChain's ChatOpenAI, as agent frameworks use it, against the server: structured output in
its three modes, and tools bound with a forced and an automatic choice."""

from __future__ import annotations

import json

import pytest
from pydantic import BaseModel

from tests.engine.server.conftest import MODEL

langchain_openai = pytest.importorskip("langchain_openai")


class Person(BaseModel):
    name: str
    age: int


def get_weather(city: str) -> str:
    """The weather in a city."""
    return f"sunny in {city}"


@pytest.fixture(scope="module")
def chat_model(server):
    return langchain_openai.ChatOpenAI(base_url=f"{server.url}/v1", api_key="unused",
                                       model=MODEL, temperature=0, max_tokens=80,
                                       max_retries=0, timeout=60)


ASK = "John is 25 years old. Give his name and age as JSON with the keys name and age."


@pytest.mark.parametrize("method", ["json_schema", "function_calling"])
def test_with_structured_output_gives_the_pydantic_model(chat_model, method):
    person = chat_model.with_structured_output(Person, method=method).invoke(ASK)
    assert isinstance(person, Person)


def test_with_structured_output_in_json_mode_gives_a_json_object(chat_model):
    schema = {"title": "Person", "type": "object",
              "properties": {"name": {"type": "string"}, "age": {"type": "integer"}}}
    reply = chat_model.with_structured_output(schema, method="json_mode").invoke(ASK)
    assert isinstance(reply, dict)


def test_bind_tools_with_a_forced_choice_calls_that_tool(chat_model):
    message = chat_model.bind_tools([get_weather], tool_choice="get_weather").invoke(
        "What is the weather in Paris?")
    (call,) = message.tool_calls
    assert call["name"] == "get_weather" and isinstance(call["args"].get("city"), str)


def test_bind_tools_with_required_calls_a_tool(chat_model):
    message = chat_model.bind_tools([get_weather], tool_choice="required").invoke(
        "What is the weather in Paris?")
    assert message.tool_calls and message.tool_calls[0]["name"] == "get_weather"


def test_bind_tools_with_auto_answers_in_text_or_calls(chat_model):
    message = chat_model.bind_tools([get_weather]).invoke("What is the weather in Paris?")
    assert message.tool_calls or (message.content and "<tool_call>" not in message.content)
    for call in message.tool_calls:
        json.dumps(call["args"])
