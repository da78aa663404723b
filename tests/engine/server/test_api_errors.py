"""Every error the API gives is in OpenAI's shape, with the right status and the field at fault."""

import json

import httpx
import pytest
from openai import BadRequestError

from pagoda.engine.async_engine import AsyncEngine
from pagoda.engine.errors import PromptTooLongError
from pagoda.engine.server.api import ServerSettings
from pagoda.engine.server.runner import BindRefused, check_bind_address
from pagoda.engine.server.security import key_digest
from pagoda.engine.server.served import ServedModel
from tests.engine.server.conftest import MODEL

KEY = "sk-test-0123456789"
CHAT = [{"role": "user", "content": "Hi"}]


def post(server, path: str, body, headers=None) -> httpx.Response:
    kwargs = {"content": body} if isinstance(body, (bytes, str)) else {"json": body}
    return httpx.post(f"{server.url}{path}", headers=headers or {}, timeout=60, **kwargs)


def chat(**fields) -> dict:
    return {"model": MODEL, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2,
            **fields}


def error_of(response: httpx.Response, status: int) -> dict:
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    return error


@pytest.mark.parametrize(("fields", "param"), [
    ({"temperature": -1.0}, "temperature"),
    ({"top_p": 0}, "top_p"),
    ({"max_tokens": 0}, "max_tokens"),
    ({"presence_penalty": 5}, "presence_penalty"),
    ({"top_k": -7}, "top_k"),
    ({"typical_p": 0}, "typical_p"),
    ({"min_tokens": -1}, "min_tokens"),
    ({"min_tokens": 5, "max_tokens": 4}, "min_tokens"),
    ({"seed": -1}, "seed"),
    ({"stop": [""]}, "stop"),
    ({"thinking_token_budget": -1}, "thinking_token_budget"),
])
def test_out_of_range_sampling_value_is_a_400_naming_the_field(server, fields, param):
    error = error_of(post(server, "/v1/chat/completions", chat(**fields)), 400)
    assert error["param"] == param
    assert error["type"] == "invalid_request_error"
    assert param in error["message"]


@pytest.mark.parametrize(("fields", "param"), [
    ({"temperature": "0.5"}, "temperature"),
    ({"max_tokens": 2.5}, "max_tokens"),
    ({"min_tokens": 2.5}, "min_tokens"),
    ({"n": 0}, "n"),
    ({"n": 99}, "n"),
    ({"stream": "yes"}, "stream"),
    ({"messages": [{"role": "user", "content": "a"}, {"role": "user"}, {"content": "x"}]},
     "messages[2].role"),
    ({"messages": "hello"}, "messages"),
])
def test_wrongly_typed_field_is_a_400_with_its_path(server, fields, param):
    error = error_of(post(server, "/v1/chat/completions", chat(**fields)), 400)
    assert error["param"] == param
    assert error["message"].startswith(param)


def test_unknown_role_is_a_400_naming_the_message(server):
    body = chat(messages=[{"role": "user", "content": "a"}, {"role": "wizard", "content": "b"}])
    error = error_of(post(server, "/v1/chat/completions", body), 400)
    assert error["param"] == "messages[1].role"
    assert "'wizard'" in error["message"]


@pytest.mark.parametrize(("message", "param"), [
    ({"role": "user", "content": "Hi", "audio": {"id": "a1"}}, "messages[1].audio"),
    ({"role": "user", "content": "Hi", "reasoning_content": "hmm"},
     "messages[1].reasoning_content"),
])
def test_a_message_field_this_server_does_not_read_is_a_400_naming_it(server, message, param):
    body = chat(messages=[{"role": "system", "content": "Be brief."}, message])
    error = error_of(post(server, "/v1/chat/completions", body), 400)
    assert error["param"] == param


def test_null_fields_the_sdks_send_back_with_an_assistant_message_are_accepted(server):
    """An SDK's message.model_dump() carries refusal, annotations, audio and function_call as
    null: nothing to honour, nothing refused."""
    sent_back = {"role": "assistant", "content": "Hello!", "refusal": None, "annotations": None,
                 "audio": None, "function_call": None, "tool_calls": None}
    body = chat(messages=[{"role": "user", "content": "Hi"}, sent_back,
                          {"role": "user", "content": "Again"}])
    assert post(server, "/v1/chat/completions", body).status_code == 200


def test_empty_messages_and_empty_prompt_are_400(server):
    assert error_of(post(server, "/v1/chat/completions", chat(messages=[])), 400)["param"] \
        == "messages"
    empty = {"model": MODEL, "prompt": ""}
    assert "empty" in error_of(post(server, "/v1/completions", empty), 400)["message"]


def test_prompt_over_the_context_is_a_400_with_both_numbers(server, served):
    limit = served.max_model_len
    body = {"model": MODEL, "prompt": [1000] * (limit + 5), "max_tokens": 2}
    error = error_of(post(server, "/v1/completions", body), 400)
    assert error["code"] == "context_length_exceeded"
    assert str(limit + 5) in error["message"] and str(limit) in error["message"]


def test_token_id_outside_the_vocabulary_is_a_400(server):
    error = error_of(post(server, "/v1/completions", {"prompt": [1, 10**9], "max_tokens": 2}),
                     400)
    assert "outside the vocabulary" in error["message"]


def test_lone_surrogate_in_a_message_is_a_400(server):
    body = b'{"messages": [{"role": "user", "content": "bad \\ud83d"}], "max_tokens": 2}'
    error = error_of(post(server, "/v1/chat/completions", body,
                          {"content-type": "application/json"}), 400)
    assert "lone surrogate" in error["message"]


@pytest.mark.parametrize(("body", "param"), [
    (b'{"prompt": "bad \\ud83d"}', "prompt"),
    (b'{"messages": [{"role": "user", "content": "bad \\ud83d"}]}', "messages[0].content"),
])
def test_lone_surrogate_in_tokenize_is_a_400_naming_the_field(server, body, param):
    error = error_of(post(server, "/tokenize", body, {"content-type": "application/json"}), 400)
    assert error["param"] == param
    assert error["message"].startswith(f"{param} holds a lone surrogate U+D83D")


def test_unknown_model_is_a_404(server):
    error = error_of(post(server, "/v1/chat/completions", chat(model="gpt-9")), 404)
    assert error["param"] == "model" and MODEL in error["message"]


def test_body_that_is_not_json_is_a_400(server):
    error = error_of(post(server, "/v1/chat/completions", b"{not json",
                          {"content-type": "application/json"}), 400)
    assert "JSON" in error["message"]


@pytest.mark.parametrize(("fields", "param"), [
    ({"modalities": ["text", "audio"]}, "modalities"),
])
def test_chat_fields_this_server_cannot_honour_are_refused_in_words(client, fields, param):
    with pytest.raises(BadRequestError) as caught:
        client.chat.completions.create(model=MODEL, messages=CHAT, max_tokens=2, **fields)
    assert caught.value.status_code == 400 and caught.value.param == param
    assert caught.value.body["message"].startswith(f"{param} is not supported by this server: ")


def test_reasoning_effort_is_refused_with_its_reason_for_a_model_whose_template_lacks_it(client):
    with pytest.raises(BadRequestError) as caught:
        client.chat.completions.create(model=MODEL, messages=CHAT, max_tokens=2,
                                       reasoning_effort="low")
    assert caught.value.status_code == 400 and caught.value.param == "reasoning_effort"
    assert "its chat template has no reasoning settings" in caught.value.body["message"]


@pytest.mark.parametrize(("fields", "param"), [
    ({"suffix": " the end."}, "suffix"),
    ({"best_of": 3}, "best_of"),
])
def test_completion_fields_this_server_cannot_honour_are_refused_in_words(client, fields, param):
    with pytest.raises(BadRequestError) as caught:
        client.completions.create(model=MODEL, prompt="Hi", max_tokens=2, **fields)
    assert caught.value.param == param and "not supported by this server" in caught.value.message


def test_values_that_ask_for_nothing_are_served(client):
    reply = client.chat.completions.create(
        model=MODEL, messages=CHAT, max_tokens=2, logprobs=False, logit_bias={},
        response_format={"type": "text"}, user="someone", extra_body={"tools": []})
    assert reply.choices[0].message.content is not None


@pytest.mark.parametrize("name", ["dry_multiplier", "prediction", "verbosity"])
def test_a_field_this_server_does_not_know_is_refused_in_words(client, name):
    with pytest.raises(BadRequestError) as caught:
        client.chat.completions.create(model=MODEL, messages=CHAT, max_tokens=2,
                                       extra_body={name: 1})
    assert caught.value.param == name
    assert caught.value.body["message"].startswith(f"Unrecognized request argument supplied: {name}")


@pytest.mark.parametrize("mirostat", [1, 2])
def test_mirostat_is_refused_with_its_reason(client, mirostat):
    with pytest.raises(BadRequestError) as caught:
        client.chat.completions.create(model=MODEL, messages=CHAT, max_tokens=2,
                                       extra_body={"mirostat": mirostat, "mirostat_tau": 5.0})
    assert caught.value.param == "mirostat"
    assert "its sampler has no mirostat" in caught.value.message


def test_mirostat_off_and_its_tuning_are_served(client):
    reply = client.completions.create(model=MODEL, prompt="Hi", max_tokens=2, extra_body={
        "mirostat": 0, "mirostat_tau": 5.0, "mirostat_eta": 0.1})
    assert reply.choices[0].text is not None


def test_fields_that_change_nothing_here_are_served(client):
    reply = client.chat.completions.create(
        model=MODEL, messages=CHAT, max_tokens=2, store=False, metadata={"chat": "1"},
        service_tier="auto")
    assert reply.choices[0].message.content is not None


def test_an_image_part_is_refused_as_text_only(client):
    image = {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0KGgo="}}
    content = [{"type": "text", "text": "What is in this picture?"}, image]
    with pytest.raises(BadRequestError) as caught:
        client.chat.completions.create(model=MODEL, max_tokens=2,
                                       messages=[{"role": "user", "content": content}])
    assert caught.value.param == "messages[0].content[1]"
    assert "'image_url' part: this model takes text only" in caught.value.message


def test_text_parts_are_read_as_one_text(client):
    parts = [{"type": "text", "text": "Say "}, {"type": "text", "text": "hi."}]
    by_parts = client.chat.completions.create(model=MODEL, temperature=0, max_tokens=4,
                                              messages=[{"role": "user", "content": parts}])
    by_text = client.chat.completions.create(model=MODEL, temperature=0, max_tokens=4,
                                             messages=[{"role": "user", "content": "Say hi."}])
    assert by_parts.choices[0].message.content == by_text.choices[0].message.content


def test_body_over_the_limit_is_a_413(start_server):
    small = start_server(ServerSettings(max_body_bytes=1000))
    error = error_of(post(small, "/v1/completions", {"prompt": "x" * 2000}), 413)
    assert "1000 bytes" in error["message"]

    def chunked():
        yield b'{"prompt": "'
        for _ in range(20):
            yield b"x" * 100
        yield b'"}'

    response = httpx.post(f"{small.url}/v1/completions", content=chunked(), timeout=30,
                          headers={"content-type": "application/json"})
    error_of(response, 413)


def test_api_key_is_required_on_v1_routes_when_set(start_server):
    guarded = start_server(ServerSettings(api_key=KEY))
    assert error_of(post(guarded, "/v1/completions", {"prompt": "Hi"}), 401)["code"] \
        == "invalid_api_key"
    wrong = {"Authorization": "Bearer sk-wrong"}
    error_of(post(guarded, "/v1/completions", {"prompt": "Hi"}, wrong), 401)
    error_of(httpx.get(f"{guarded.url}/v1/models"), 401)
    error_of(post(guarded, "/tokenize", {"prompt": "Hi"}), 401)
    right = {"Authorization": f"Bearer {KEY}"}
    assert post(guarded, "/v1/completions", {"prompt": "Hi", "max_tokens": 1}, right) \
        .status_code == 200
    assert httpx.get(f"{guarded.url}/health").status_code == 200


def test_a_server_given_only_the_keys_digest_checks_the_key(start_server):
    guarded = start_server(ServerSettings(api_key_sha256=key_digest(KEY)))
    error_of(post(guarded, "/v1/completions", {"prompt": "Hi"},
                  {"Authorization": f"Bearer {key_digest(KEY)}"}), 401)
    right = {"Authorization": f"Bearer {KEY}"}
    assert post(guarded, "/v1/completions", {"prompt": "Hi", "max_tokens": 1}, right) \
        .status_code == 200


def test_without_a_key_any_caller_is_served(server):
    assert post(server, "/v1/completions", {"prompt": "Hi", "max_tokens": 1}).status_code == 200


def test_openai_client_with_the_right_key_is_served(start_server):
    from openai import AuthenticationError, OpenAI

    guarded = start_server(ServerSettings(api_key=KEY))
    ok = OpenAI(base_url=f"{guarded.url}/v1", api_key=KEY, max_retries=0)
    assert ok.completions.create(model=MODEL, prompt="Hi", max_tokens=1).choices
    bad = OpenAI(base_url=f"{guarded.url}/v1", api_key="nope", max_retries=0)
    with pytest.raises(AuthenticationError):
        bad.models.list()


@pytest.mark.parametrize("host", ["0.0.0.0", "192.168.1.5", "::", "example.com"])
def test_binding_a_reachable_address_without_a_key_is_refused(host):
    with pytest.raises(BindRefused, match="without an API key"):
        check_bind_address(host, None)
    check_bind_address(host, KEY)


@pytest.mark.parametrize("host", ["127.0.0.1", "::1", "localhost", "127.0.0.2"])
def test_loopback_needs_no_key(host):
    check_bind_address(host, None)


def test_cors_is_off_unless_origins_are_listed(server, start_server):
    preflight = {"Origin": "http://evil.example", "Access-Control-Request-Method": "POST"}
    response = httpx.options(f"{server.url}/v1/completions", headers=preflight)
    assert "access-control-allow-origin" not in response.headers
    allowed = start_server(ServerSettings(allowed_origins=("http://ui.example",)))
    ok = httpx.options(f"{allowed.url}/v1/completions",
                       headers={**preflight, "Origin": "http://ui.example"})
    assert ok.headers["access-control-allow-origin"] == "http://ui.example"
    refused = httpx.options(f"{allowed.url}/v1/completions", headers=preflight)
    assert "access-control-allow-origin" not in refused.headers


def test_dead_engine_answers_503_with_the_reason(start_server, make_engine):
    engine = AsyncEngine(engine=make_engine(num_kv_blocks=16, num_threads=1))
    engine.shutdown()
    dead = start_server(source=lambda: ServedModel(MODEL, engine, 2048))
    error = error_of(post(dead, "/v1/chat/completions", chat()), 503)
    assert "shut down" in error["message"]
    assert httpx.get(f"{dead.url}/health").status_code == 503


def test_no_model_loaded_yet_answers_503(start_server):
    loading = start_server(source=lambda: None)
    assert error_of(post(loading, "/v1/completions", {"prompt": "Hi"}), 503)["code"] \
        == "model_loading"
    assert httpx.get(f"{loading.url}/v1/models").json()["data"] == []


def test_prompt_too_long_error_keeps_the_engine_message(served):
    from pagoda.engine.server.errors import from_engine_error

    error = from_engine_error(PromptTooLongError("the prompt has 9 tokens; context holds 8"),
                              "prompt")
    assert (error.status, error.param, error.code) == (400, "prompt", "context_length_exceeded")


def test_detokenize_spells_what_tokenize_counted(server):
    tokens = post(server, "/tokenize", json.dumps({"prompt": "Paris, the capital"}).encode(),
                  {"content-type": "application/json"}).json()["tokens"]
    reply = post(server, "/detokenize", json.dumps({"tokens": tokens}).encode(),
                 {"content-type": "application/json"})
    assert reply.status_code == 200 and reply.json()["prompt"].endswith("Paris, the capital")


def test_detokenize_refuses_an_id_outside_the_vocabulary(server):
    body = json.dumps({"tokens": [1, 10**9]}).encode()
    error = error_of(post(server, "/detokenize", body, {"content-type": "application/json"}),
                     400)
    assert error["param"] == "tokens" and "1000000000" in error["message"]
