"""What one client can ask of the server is bounded, so everyone else is still served: choices
per request, tokens of work in progress, and prompts far over the context refused untokenized."""

import threading
import time

import httpx
import openai
import pytest
from openai import OpenAI

from pagoda.engine.server.admission import WorkBudget
from pagoda.engine.server.api import ServerSettings
from pagoda.engine.server.errors import APIError
from pagoda.engine.server.protocol import MAX_CHOICES
from pagoda.engine.server.security import DEFAULT_MAX_JSON_CONTAINERS, json_containers
from tests.engine.server.conftest import MODEL
from tests.engine.tokenizer_threads import hold_long_texts, note_encoding_threads

TINY = [{"role": "user", "content": "Hi"}]
TIMEOUT_S = 30


def post(server, path: str, body: dict) -> httpx.Response:
    return httpx.post(f"{server.url}{path}", json=body, timeout=TIMEOUT_S)


def error_of(response: httpx.Response, status: int) -> dict:
    assert response.status_code == status, response.text
    return response.json()["error"]


def client_of(server) -> OpenAI:
    return OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0,
                  timeout=TIMEOUT_S)


def wait_for(condition, what: str) -> None:
    deadline = time.monotonic() + TIMEOUT_S
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)


def assert_still_serving(client, served) -> None:
    assert served.backend.stats().num_waiting == 0
    reply = client.chat.completions.create(model=MODEL, messages=TINY, max_tokens=2)
    assert reply.choices[0].finish_reason in {"stop", "length"}


def test_a_batch_bomb_is_refused_at_once_and_others_are_still_served(server, client, served):
    began = time.monotonic()
    body = {"model": MODEL, "prompt": [[1]] * 4_000, "n": 16, "max_tokens": 16}
    error = error_of(post(server, "/v1/completions", body), 400)
    assert time.monotonic() - began < 10
    assert error["code"] == "too_many_choices" and error["param"] == "prompt"
    assert "64000 choices" in error["message"] and f"at most {MAX_CHOICES}" in error["message"]
    assert_still_serving(client, served)


@pytest.mark.parametrize("path", ["/v1/completions", "/v1/chat/completions", "/tokenize"])
def test_a_body_of_too_many_json_values_is_refused_before_it_is_parsed(server, client, served,
                                                                       path):
    began = time.monotonic()
    bomb = {"model": MODEL, "prompt": [[1]] * 150_000, "n": 16,
            "messages": [{"role": "user", "content": "a"}] * 70_000}
    error = error_of(post(server, path, bomb), 413)
    assert time.monotonic() - began < 10
    assert error["code"] == "request_too_large"
    assert f"more than {DEFAULT_MAX_JSON_CONTAINERS} JSON arrays and objects" in error["message"]
    assert_still_serving(client, served)


def test_brackets_inside_strings_are_not_json_values(server, client):
    assert json_containers(b'{"a": ["[{", "\\"[", {"b": "]}"}]}') == 3
    text = "[{x}] " * (DEFAULT_MAX_JSON_CONTAINERS // 2 + 1)
    reply = client.completions.create(model=MODEL, prompt=text[:2000], max_tokens=1)
    assert reply.choices
    count = httpx.post(f"{server.url}/tokenize", json={"prompt": text}, timeout=TIMEOUT_S)
    assert count.status_code == 200, count.text


def test_one_choice_over_the_cap_is_refused(server):
    body = {"model": MODEL, "prompt": [[1]] * (MAX_CHOICES // 16 + 1), "n": 16}
    assert error_of(post(server, "/v1/completions", body), 400)["code"] == "too_many_choices"


def test_a_request_for_more_work_than_the_server_takes_is_a_400(start_server, served):
    small = start_server(ServerSettings(max_work_contexts=1))
    with pytest.raises(openai.BadRequestError) as caught:
        client_of(small).chat.completions.create(model=MODEL, messages=TINY, n=2)
    assert caught.value.code == "request_too_large"
    assert f"1 contexts of {served.max_model_len} tokens" in caught.value.message


def test_work_in_progress_is_bounded_by_tokens_and_freed_when_its_client_leaves(start_server):
    small = start_server(ServerSettings(max_work_contexts=1))
    budget = small.app.state.work_budget
    client = client_of(small)
    # No max_tokens: this reply may fill the whole context, all the server takes at once.
    stream = client.chat.completions.create(model=MODEL, messages=TINY, stream=True,
                                            extra_body={"ignore_eos": True})
    next(iter(stream))
    with pytest.raises(openai.RateLimitError) as caught:
        client.chat.completions.create(model=MODEL, messages=TINY, max_tokens=2)
    assert caught.value.code == "server_busy" and "try again" in caught.value.message
    stream.close()
    wait_for(lambda: budget.in_flight == 0, "the stream's work to be released")
    assert client.chat.completions.create(model=MODEL, messages=TINY, max_tokens=2).choices


def test_admitted_work_is_released_once():
    budget = WorkBudget(contexts=2)
    first = budget.admit(150, max_model_len=100)
    with pytest.raises(APIError, match="the server is busy") as caught:
        budget.admit(60, max_model_len=100)
    assert caught.value.status == 429
    first.release()
    first.release()
    assert budget.in_flight == 0
    assert budget.admit(200, max_model_len=100).work == 200


@pytest.mark.parametrize(("path", "field"), [
    ("/v1/chat/completions", "messages"), ("/v1/completions", "prompt"), ("/tokenize", "prompt"),
    ("/tokenize", "messages"),
])
def test_a_prompt_no_context_could_hold_is_refused_without_tokenizing(server, served,
                                                                      monkeypatch, path, field):
    threads = note_encoding_threads(served.backend.chat_tokenizer, monkeypatch)
    huge = "x" * (served.backend.chat_tokenizer.max_chars + 1)
    prompt = {"messages": [{"role": "user", "content": huge}]} if field == "messages" \
        else {"prompt": huge}
    error = error_of(post(server, path, {"model": MODEL, "max_tokens": 2, **prompt}), 400)
    assert error["param"] == field and error["code"] == "context_length_exceeded"
    assert f"context of {served.max_model_len} tokens" in error["message"]
    assert threads == []


def test_a_tiny_chat_is_answered_while_a_long_prompt_is_still_tokenized(server, client, served,
                                                                        monkeypatch):
    entered, release = hold_long_texts(served.backend.chat_tokenizer, monkeypatch, TIMEOUT_S)
    long_count: list[int] = []
    long_body = {"model": MODEL, "prompt": "All work and no play. " * 500}
    counting = threading.Thread(
        target=lambda: long_count.append(post(server, "/tokenize", long_body).json()["count"]))
    counting.start()
    try:
        assert entered.wait(TIMEOUT_S)
        reply = client.chat.completions.create(model=MODEL, messages=TINY, max_tokens=2)
        assert reply.choices and not long_count
    finally:
        release.set()
        counting.join(TIMEOUT_S)
    assert long_count and long_count[0] > 2000
