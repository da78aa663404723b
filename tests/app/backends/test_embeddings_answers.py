"""An embeddings server's answers are checked before they are believed: what a broken or
foreign server sends is refused in words naming the server, and an answer too large is refused
before it is read whole. (A real server's vectors: test_embeddings_client.py.)"""

import json

import numpy as np
import pytest
from conftest import run
from fastapi import FastAPI
from fastapi.responses import JSONResponse, Response

from pagoda.app.backends import MalformedStreamError
from pagoda.app.backends.services.embeddings import (
    MAX_ANSWER_BYTES,
    EmbeddingModel,
    EmbeddingsClient,
    EmbeddingsError,
    unit_rows,
    vectors_of,
)
from pagoda.engine.server.runner import ServerThread

URL = "http://example/v1"


def answer(*vectors, indexes=None) -> dict:
    indexes = indexes or range(len(vectors))
    return {"object": "list", "data": [{"object": "embedding", "index": i, "embedding": v}
                                       for i, v in zip(indexes, vectors, strict=True)]}


def test_vectors_are_put_in_the_order_of_their_index():
    got = vectors_of(answer([0.0, 1.0], [1.0, 0.0], indexes=[1, 0]), 2, URL)
    assert got.tolist() == [[1.0, 0.0], [0.0, 1.0]]


@pytest.mark.parametrize("bad, words", [
    ({"data": []}, "0 vectors for 2 texts"),
    ({"detail": "nope"}, "no vectors for 2 texts"),
    (answer([1.0], [1.0], indexes=[0, 0]), "index"),
    (answer([1.0], [1.0], indexes=[0, 5]), "index"),
    (answer([1.0], [1.0, 2.0]), "different widths"),
    (answer([1.0], ["x"]), "finite numbers"),
    (answer([1.0], [float("nan")]), "finite numbers"),
    (answer([1.0], []), "finite numbers"),
    (answer([1.0], [True]), "finite numbers"),
])
def test_a_wrong_answer_is_refused_in_words(bad, words):
    with pytest.raises(MalformedStreamError, match=words) as caught:
        vectors_of(bad, 2, URL)
    assert URL in str(caught.value)


def test_rows_come_back_at_unit_length_and_a_zero_row_stays_zero():
    rows = unit_rows(np.array([[3.0, 4.0], [0.0, 0.0]], dtype=np.float32))
    np.testing.assert_allclose(rows, [[0.6, 0.8], [0.0, 0.0]], rtol=1e-6)


@pytest.fixture(scope="module")
def odd_server():
    """A server whose /v1/embeddings answers by the model asked: too much, or nothing."""
    app = FastAPI()

    @app.post("/v1/embeddings")
    async def embeddings(body: dict) -> Response:
        if body["model"] == "huge":
            vector = json.dumps([0.5] * 1000)
            items = ",".join(f'{{"index":0,"embedding":{vector}}}'
                             for _ in range(MAX_ANSWER_BYTES // len(vector) + 2))
            return Response(f'{{"data":[{items}]}}', media_type="application/json")
        if body["model"] == "missing":
            return JSONResponse({"error": {"message": "model 'missing' not found"}},
                                status_code=404)
        return JSONResponse(answer(*([3.0, 4.0] for _ in body["input"])))

    server = ServerThread(app).start()
    yield f"{server.url}/v1"
    server.stop()


def test_an_answer_larger_than_the_bound_is_refused(odd_server):
    client = EmbeddingsClient(EmbeddingModel(odd_server, "huge"))
    with pytest.raises(MalformedStreamError, match="more than 24 MiB"):
        run(client.embed(["a"]))


def test_a_server_without_the_model_says_how_to_serve_one(odd_server):
    client = EmbeddingsClient(EmbeddingModel(odd_server, "missing"))
    with pytest.raises(EmbeddingsError, match="--embeddings") as caught:
        run(client.embed(["a"]))
    assert "model 'missing' not found" in str(caught.value)


def test_a_request_asks_for_floats_and_its_vectors_are_normalised(odd_server):
    client = EmbeddingsClient(EmbeddingModel(odd_server, "fine"))
    np.testing.assert_allclose(run(client.embed(["a", "b"])), [[0.6, 0.8]] * 2, rtol=1e-6)


def test_more_texts_than_a_request_holds_is_the_callers_mistake(odd_server):
    client = EmbeddingsClient(EmbeddingModel(odd_server, "fine"))
    with pytest.raises(ValueError, match="at most 64 texts"):
        run(client.embed(["a"] * 65))
