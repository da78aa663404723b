"""Structured output, logit controls and logprobs over the API, through the real openai client."""

from __future__ import annotations

import asyncio
import json
import os
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import jsonschema
import pytest
from openai import BadRequestError
from pydantic import BaseModel

from tests.engine.server.conftest import MODEL
from tests.engine.structured_output.schemas import SLOW_REGEX

PERSON = {"type": "object", "properties": {"name": {"type": "string"},
                                          "age": {"type": "integer"}},
          "required": ["name", "age"], "additionalProperties": False}
ASK_PERSON = [{"role": "user", "content": "Describe John, who is 25, as JSON."}]


class Person(BaseModel):
    name: str
    age: int


def _chat(client, **kw):
    kw.setdefault("max_tokens", 80)
    kw.setdefault("temperature", 0)
    return client.chat.completions.create(model=MODEL, messages=ASK_PERSON, **kw)


def test_parse_with_a_pydantic_model_gives_the_model(client):
    reply = client.chat.completions.parse(model=MODEL, messages=ASK_PERSON, max_tokens=80,
                                          temperature=0, response_format=Person)
    assert isinstance(reply.choices[0].message.parsed, Person)


def test_json_schema_response_format_gives_valid_json(client):
    reply = _chat(client, response_format={"type": "json_schema", "json_schema": {
        "name": "person", "schema": PERSON, "strict": True}})
    jsonschema.validate(json.loads(reply.choices[0].message.content), PERSON)


def test_json_object_response_format_gives_an_object(client):
    reply = client.chat.completions.create(
        model=MODEL, max_tokens=60, temperature=0, response_format={"type": "json_object"},
        messages=[{"role": "user", "content": 'Reply with the JSON object {"ok": true}.'}])
    assert reply.choices[0].finish_reason == "stop"
    assert isinstance(json.loads(reply.choices[0].message.content), dict)


def test_streamed_json_schema_reply_joins_to_the_whole_one(client):
    response_format = {"type": "json_schema", "json_schema": {"name": "person",
                                                              "schema": PERSON}}
    whole = _chat(client, response_format=response_format).choices[0].message.content
    stream = _chat(client, stream=True, response_format=response_format)
    text = "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
    assert text == whole
    jsonschema.validate(json.loads(text), PERSON)


@pytest.mark.parametrize("extra", [
    {"structured_outputs": {"choice": ["yes", "no"]}},
    {"guided_choice": ["yes", "no"]},
    {"guided_regex": "(yes|no)"},
    {"grammar": 'root ::= "yes" | "no"'},
    {"structured_outputs": {"grammar": 'root ::= "yes" | "no"'}},
])
def test_vllm_and_llama_cpp_constraint_fields_are_honoured(client, extra):
    reply = client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "Is the sky green?"}],
        max_tokens=10, temperature=1.0, seed=1, extra_body=extra)
    assert reply.choices[0].message.content in ("yes", "no")


def test_llama_cpp_json_schema_field_is_honoured(client):
    reply = client.completions.create(model=MODEL, prompt="A person as JSON: ", max_tokens=60,
                                      temperature=0, extra_body={"json_schema": PERSON})
    jsonschema.validate(json.loads(reply.choices[0].text), PERSON)


def test_a_schema_that_cannot_compile_is_a_400_naming_the_field(server):
    body = {"model": MODEL, "messages": ASK_PERSON, "response_format": {
        "type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "nonsense"}}}}
    reply = httpx.post(f"{server.url}/v1/chat/completions", json=body, timeout=60)
    assert reply.status_code == 400
    error = reply.json()["error"]
    assert error["param"] == "response_format.json_schema.schema"
    assert "nonsense" in error["message"]


@pytest.mark.parametrize(("schema", "keyword"), [
    ({"type": "object", "properties": {"name": {"not": {"type": "string"}}}}, "not"),
    ({"type": "array", "items": {"type": "integer"}, "uniqueItems": True}, "uniqueItems"),
    ({"type": "number", "multipleOf": 7}, "multipleOf"),
    ({"$ref": "https://example.com/person.json"}, "$ref"),
])
def test_schema_keywords_a_reply_could_break_are_400s_naming_them(client, schema, keyword):
    with pytest.raises(BadRequestError) as caught:
        _chat(client, response_format={"type": "json_schema", "json_schema": {
            "name": "x", "schema": schema}})
    assert caught.value.param == "response_format.json_schema.schema"
    assert f"keyword '{keyword}'" in str(caught.value)


def test_an_unknown_field_inside_response_format_is_a_400_naming_it(client):
    with pytest.raises(BadRequestError) as caught:
        _chat(client, response_format={"type": "json_schema", "json_schema": {
            "name": "person", "schema": PERSON, "bogus": 1}})
    assert caught.value.param == "response_format.json_schema.bogus"


@pytest.mark.slow
def test_a_regex_too_slow_to_compile_is_refused_while_another_clients_schema_is_served(
        server, client, async_engine, monkeypatch):
    monkeypatch.setattr(async_engine.grammar_workers, "timeout_s", 5)
    body = {"model": MODEL, "messages": ASK_PERSON, "max_tokens": 5, "guided_regex": SLOW_REGEX}
    started = time.monotonic()
    with ThreadPoolExecutor(1) as pool:
        slow = pool.submit(httpx.post, f"{server.url}/v1/chat/completions", json=body,
                           timeout=120)
        time.sleep(0.5)
        schema = {**PERSON, "title": "Someone"}  # not compiled before
        reply = _chat(client, response_format={"type": "json_schema", "json_schema": {
            "name": "person", "schema": schema}})
        refused = slow.result()
    jsonschema.validate(json.loads(reply.choices[0].message.content), PERSON)
    assert refused.status_code == 400
    assert "did not compile within 5 s" in refused.json()["error"]["message"]
    assert refused.json()["error"]["param"] == "guided_regex"
    assert time.monotonic() - started < 60  # a compile takes a minute; the bound is 5 s


@pytest.mark.slow
def test_a_client_that_leaves_stops_its_compile(server, async_engine, monkeypatch):
    monkeypatch.setattr(async_engine.grammar_workers, "timeout_s", 600)
    body = {"model": MODEL, "messages": ASK_PERSON, "max_tokens": 5,
            "guided_regex": SLOW_REGEX.replace("a", "x")}  # not cached by another test
    workers = async_engine.grammar_workers
    # Both processes started (each compile takes ~1 s), so the slow one runs in one of them.
    asyncio.run(_both(workers.compile("regex", "[^q]{1,100}"),
                      workers.compile("regex", "[^r]{1,100}")))
    compiling = workers.process_ids()
    with pytest.raises(httpx.TimeoutException):
        httpx.post(f"{server.url}/v1/chat/completions", json=body, timeout=3)
    deadline = time.monotonic() + 15
    while all(_alive(pid) for pid in compiling) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not all(_alive(pid) for pid in compiling)  # its process was killed


async def _both(*compiles):
    return await asyncio.gather(*compiles)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_two_constraints_at_once_are_refused(server):
    body = {"model": MODEL, "messages": ASK_PERSON, "guided_regex": "a+",
            "response_format": {"type": "json_object"}}
    reply = httpx.post(f"{server.url}/v1/chat/completions", json=body, timeout=60)
    assert reply.status_code == 400
    assert "both constrain" in reply.json()["error"]["message"]


def test_logit_bias_minus_100_bans_the_greedy_first_token(client, llm):
    messages = [{"role": "user", "content": "Say hello."}]
    free = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=3,
                                          temperature=0, logprobs=True)
    first = free.choices[0].logprobs.content[0].token
    token_id = llm.tokenizer.convert_tokens_to_ids(
        llm.tokenizer.tokenize(first)[0]) if first else None
    banned = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=3,
                                            temperature=0, logit_bias={str(token_id): -100},
                                            logprobs=True)
    assert banned.choices[0].logprobs.content[0].token != first


def test_chat_logprobs_come_in_openais_shape(client):
    reply = _chat(client, max_tokens=5, logprobs=True, top_logprobs=3)
    entries = reply.choices[0].logprobs.content
    assert len(entries) == reply.usage.completion_tokens
    assert "".join(e.token for e in entries) == reply.choices[0].message.content
    for entry in entries:
        assert len(entry.top_logprobs) == 3 and entry.logprob <= 0
        assert bytes(entry.bytes).decode("utf-8", errors="replace") == entry.token
        assert entry.top_logprobs[0].logprob >= entry.logprob


def test_streamed_chat_logprobs_cover_every_token(client):
    stream = _chat(client, max_tokens=6, stream=True, logprobs=True, top_logprobs=1)
    entries = [e for c in stream if c.choices and c.choices[0].logprobs
               for e in c.choices[0].logprobs.content]
    assert len(entries) == 6


def test_completion_logprobs_come_in_the_legacy_shape(client):
    reply = client.completions.create(model=MODEL, prompt="The sky is", max_tokens=4,
                                      temperature=0, logprobs=2)
    logprobs = reply.choices[0].logprobs
    assert "".join(logprobs.tokens) == reply.choices[0].text
    assert len(logprobs.token_logprobs) == 4 and all(len(t) == 2 for t in logprobs.top_logprobs)
    assert logprobs.text_offset[0] == 0


def test_top_logprobs_without_logprobs_is_refused(server):
    body = {"model": MODEL, "messages": ASK_PERSON, "top_logprobs": 2}
    reply = httpx.post(f"{server.url}/v1/chat/completions", json=body, timeout=60)
    assert reply.status_code == 400 and reply.json()["error"]["param"] == "top_logprobs"


@pytest.fixture(scope="module")
def llm(make_llm):
    return make_llm()


def test_echo_scores_the_prompt_as_evaluation_harnesses_read_it(client, llm):
    prompt = "The capital of France is Paris"
    reply = client.completions.create(model=MODEL, prompt=prompt, max_tokens=1, temperature=0,
                                      echo=True, logprobs=1)
    choice = reply.choices[0]
    assert choice.text.startswith(prompt)
    count = len(llm.tokenizer.encode(prompt))
    logprobs = choice.logprobs
    assert len(logprobs.tokens) == count + 1
    assert logprobs.token_logprobs[0] is None and logprobs.top_logprobs[0] is None
    assert all(lp <= 0 for lp in logprobs.token_logprobs[1:])
    assert "".join(logprobs.tokens) == choice.text
    assert logprobs.text_offset[count] == len(prompt)


def test_streamed_echo_sends_the_prompt_first(client):
    prompt = "Once upon a time"
    stream = client.completions.create(model=MODEL, prompt=prompt, max_tokens=4, temperature=0,
                                       echo=True, logprobs=0, stream=True)
    chunks = [c.choices[0] for c in stream if c.choices]
    assert chunks[0].text.startswith(prompt)
    whole = client.completions.create(model=MODEL, prompt=prompt, max_tokens=4, temperature=0,
                                      echo=True, logprobs=0)
    assert "".join(c.text for c in chunks) == whole.choices[0].text
    tokens = [t for c in chunks if c.logprobs for t in c.logprobs.tokens]
    assert tokens == whole.choices[0].logprobs.tokens


def test_echo_without_logprobs_repeats_the_prompt(client):
    reply = client.completions.create(model=MODEL, prompt="Hello", max_tokens=2, echo=True)
    assert reply.choices[0].text.startswith("Hello") and reply.choices[0].logprobs is None
