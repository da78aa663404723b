"""The embeddings client against a real server: Pagoda's own /v1/embeddings over the engine."""

import numpy as np
from conftest import SERVED_NAME, run

from pagoda.app.backends.services.embeddings import EmbeddingModel, EmbeddingsClient


def test_a_real_servers_vectors_come_back_in_order_at_unit_length(pagoda_server):
    client = EmbeddingsClient(EmbeddingModel(f"{pagoda_server.url}/v1", SERVED_NAME))
    texts = ["The lamp burned oil all winter.", "A recipe for bread.",
             "The lamp burned oil all winter."]
    vectors = run(client.embed(texts))
    assert vectors.shape[0] == 3 and vectors.shape[1] > 0
    np.testing.assert_allclose(np.linalg.norm(vectors, axis=1), 1.0, rtol=1e-5)
    np.testing.assert_allclose(vectors[0], vectors[2], atol=1e-4)
    assert not np.allclose(vectors[0], vectors[1], atol=1e-3)
    (alone,) = run(client.embed(["A recipe for bread."]))
    np.testing.assert_allclose(alone, vectors[1], atol=1e-3)
