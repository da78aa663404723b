"""An embedder whose notion of meaning the tests control: each word counts toward a concept, and
words of one concept (synonyms) land on the same axis, so "automobile" is close to "car" although
no three letters match. A real small model gives no such guarantee; the real server's vectors are
tested in tests/app/backends/test_embeddings_client.py. It can also be made to fail, as a server
that has gone away does."""

from __future__ import annotations

import re
import zlib

import numpy as np

from pagoda.app.backends import BackendUnreachableError
from pagoda.app.backends.services.embeddings import EmbeddingModel, unit_rows

CONCEPTS = {
    "car": 0, "automobile": 0, "vehicle": 0, "cars": 0,
    "money": 1, "cash": 1, "payment": 1, "salary": 1,
    "sea": 2, "ocean": 2, "waves": 2, "tide": 2,
    "sleep": 3, "rest": 3, "nap": 3, "tired": 3,
}
WIDTH = 16


class ConceptEmbedder:
    def __init__(self, source: EmbeddingModel) -> None:
        self.source = source
        self.requests: list[list[str]] = []
        self.down = False

    async def embed(self, texts) -> np.ndarray:
        self.requests.append(list(texts))
        if self.down:
            raise BackendUnreachableError(f"{self.source.base_url} refused the connection")
        rows = np.zeros((len(texts), WIDTH), dtype=np.float32)
        for i, text in enumerate(texts):
            for word in re.findall(r"\w+", text.lower()):
                axis = CONCEPTS.get(word, 4 + zlib.crc32(word.encode()) % (WIDTH - 4))
                rows[i, axis] += 1.0 if word in CONCEPTS else 0.1
        return unit_rows(rows)
