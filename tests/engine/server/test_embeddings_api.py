"""POST /v1/embeddings through the real `openai` client and the real server: unit vectors of the
model's width, the same for the same text however it is sent, batched or not, as floats or
base64; what it cannot embed refused with a 400 naming the input at fault."""

import base64

import httpx
import numpy as np
import pytest
from openai import BadRequestError

from tests.engine.server.conftest import MODEL

HIDDEN_SIZE = 576  # SmolLM2-135M's
TEXTS = ["The lighthouse keeper wound the clock every night.",
         "北京是中国的首都。",
         "def add(a, b):\n    return a + b\n"]


def post(server, body: dict) -> httpx.Response:
    return httpx.post(f"{server.url}/v1/embeddings", json=body, timeout=60)


def error_of(response: httpx.Response, status: int) -> dict:
    assert response.status_code == status, response.text
    return response.json()["error"]


def embed(client, given, **fields) -> list[np.ndarray]:
    answer = client.embeddings.create(model=MODEL, input=given, encoding_format="float",
                                      **fields)
    assert [item.index for item in answer.data] == list(range(len(answer.data)))
    return [np.array(item.embedding, dtype=np.float64) for item in answer.data]


def token_ids(server, text: str) -> list[int]:
    answer = httpx.post(f"{server.url}/tokenize", json={"prompt": text}, timeout=60)
    return answer.json()["tokens"]


def test_a_text_is_a_unit_vector_as_wide_as_the_models_hidden_state(client, server):
    answer = client.embeddings.create(model=MODEL, input=TEXTS[0], encoding_format="float")
    assert answer.object == "list" and answer.model == MODEL
    (item,) = answer.data
    assert item.object == "embedding" and item.index == 0
    vector = np.array(item.embedding)
    assert vector.shape == (HIDDEN_SIZE,)
    assert abs(np.linalg.norm(vector) - 1.0) < 1e-5
    num_tokens = len(token_ids(server, TEXTS[0]))
    assert answer.usage.prompt_tokens == answer.usage.total_tokens == num_tokens


def test_the_same_text_twice_gives_the_same_vector_and_another_text_another(client):
    first, again = embed(client, TEXTS[0])[0], embed(client, TEXTS[0])[0]
    other = embed(client, TEXTS[1])[0]
    assert np.abs(first - again).max() < 1e-5
    assert np.abs(first - other).max() > 1e-2


def test_a_batch_gives_each_input_the_vector_it_has_alone(client):
    batch = embed(client, TEXTS)
    alone = [embed(client, text)[0] for text in TEXTS]
    assert len(batch) == len(TEXTS)
    for got, want in zip(batch, alone, strict=True):
        assert np.abs(got - want).max() < 1e-4


def test_base64_is_the_little_endian_float32_bytes_of_the_vector(client, server):
    floats = post(server, {"model": MODEL, "input": TEXTS[1]}).json()["data"][0]["embedding"]
    encoded = post(server, {"model": MODEL, "input": TEXTS[1], "encoding_format": "base64"})
    decoded = np.frombuffer(base64.b64decode(encoded.json()["data"][0]["embedding"]), "<f4")
    assert decoded.tolist() == floats
    # The openai client asks for base64 by default, and decodes it itself.
    by_default = client.embeddings.create(model=MODEL, input=TEXTS[1])
    assert by_default.data[0].embedding == floats


def test_token_ids_give_the_vector_of_their_text(client, server):
    text = embed(client, TEXTS[2])[0]
    ids = token_ids(server, TEXTS[2])
    single, = embed(client, ids)
    listed = embed(client, [ids, token_ids(server, TEXTS[0])])
    assert np.abs(single - text).max() < 1e-5
    assert np.abs(listed[0] - text).max() < 1e-4


def test_usage_counts_every_inputs_tokens(client, server):
    answer = client.embeddings.create(model=MODEL, input=TEXTS, encoding_format="float")
    expected = sum(len(token_ids(server, text)) for text in TEXTS)
    assert answer.usage.prompt_tokens == answer.usage.total_tokens == expected


def test_dimensions_at_the_models_width_and_a_user_are_accepted(client):
    vector, = embed(client, TEXTS[0], dimensions=HIDDEN_SIZE, user="user-1234")
    assert vector.shape == (HIDDEN_SIZE,)


def test_the_openai_client_gets_a_bad_request_for_an_empty_input(client):
    with pytest.raises(BadRequestError, match="empty string"):
        client.embeddings.create(model=MODEL, input="")


@pytest.mark.parametrize(("given", "param", "words"), [
    ("", "input", "input is an empty string"),
    (["a text", ""], "input[1]", "input[1] is an empty string"),
    ([], "input", "input is empty"),
    ([[5, 6], []], "input[1]", "input[1] is an empty list of token ids"),
    (["a"] * 2049, "input", "2049 inputs"),
    ([[5] * 8193], "input[0]", "input[0] has 8193 tokens, more than the model's context of 8192"),
    ([5] * 8193, "input", "input has 8193 tokens"),
    ([[5] * 8192] * 33, "input", "270336 tokens together"),
    ([[5, 6], [1 << 20]], "input", "outside the vocabulary"),
])
def test_what_cannot_be_embedded_is_a_400_naming_the_input(server, given, param, words):
    error = error_of(post(server, {"model": MODEL, "input": given}), 400)
    assert error["param"] == param
    assert words in error["message"]


def test_an_input_longer_than_the_kv_cache_is_a_400(server):
    # Within the context (8192), beyond this engine's 128 blocks of 16 tokens.
    error = error_of(post(server, {"model": MODEL, "input": [[5] * 3000]}), 400)
    assert error["code"] == "context_length_exceeded"
    assert "KV cache" in error["message"]


@pytest.mark.parametrize(("fields", "param", "words"), [
    ({"dimensions": 64}, "dimensions", "dimensions=64"),
    ({"encoding_format": "int8"}, "encoding_format", "encoding_format"),
    ({"normalize": False}, "normalize", "Unrecognized request argument supplied: normalize"),
    ({"metadata": {"a": "b"}}, "metadata", "Unrecognized request argument supplied: metadata"),
    ({"user": 42}, "user", "user"),
])
def test_a_field_not_honoured_is_a_400_naming_it(server, fields, param, words):
    error = error_of(post(server, {"model": MODEL, "input": "hello", **fields}), 400)
    assert error["param"] == param
    assert words in error["message"]


def test_another_model_is_refused_as_chat_refuses_it(server):
    error = error_of(post(server, {"model": "text-embedding-3-small", "input": "hello"}), 404)
    assert error["param"] == "model" and error["code"] == "model_not_found"
    assert "text-embedding-3-small" in error["message"]


def test_embeddings_and_a_streamed_chat_in_flight_together_both_finish(client, async_engine):
    alone = embed(client, TEXTS)
    stream = client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "Tell me about lighthouses."}],
        max_tokens=64, temperature=0, stream=True, stream_options={"include_usage": True},
        extra_body={"ignore_eos": True})
    chunks = iter(stream)
    first = next(chunks)
    assert first.choices[0].delta.role == "assistant"
    meanwhile = embed(client, TEXTS)
    assert async_engine.stats().num_running == 1  # the chat, still being generated
    rest = list(chunks)
    assert rest[-1].usage.completion_tokens == 64
    assert [c.choices[0].finish_reason for c in rest if c.choices][-1] == "length"
    assert "".join(c.choices[0].delta.content or "" for c in rest if c.choices)
    for got, want in zip(meanwhile, alone, strict=True):
        assert np.abs(got - want).max() < 1e-4
