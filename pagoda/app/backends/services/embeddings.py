"""Vectors for texts from an OpenAI-compatible server's POST /v1/embeddings (vLLM or SGLang with
an embedding model, llama.cpp's server started with --embeddings, Ollama, another Pagoda): what
documents' passages and a question are compared by, beside their words.

Every answer is checked before it is believed: one vector per text, in order, all of the same
width, finite; and bounded before it is read. Vectors come back L2-normalised, so a dot product
is their cosine.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from pagoda.app.backends.errors import (
    BackendError,
    MalformedStreamError,
    ModelNotFoundError,
    clause,
)
from pagoda.app.backends.remote.endpoint import Endpoint

MAX_TEXTS = 64  # a request's texts; callers send more in several requests
MAX_TEXT_CHARS = 8192  # a passage is ~1,500 characters; a question is cut here
MAX_DIMENSIONS = 16_384
# 64 vectors of 16,384 numbers as JSON (~20 characters each) and some room.
MAX_ANSWER_BYTES = 24 * 2**20
EMBEDDINGS_TIMEOUT_S = 120.0


class EmbeddingsError(BackendError):
    """The server gave no usable vectors: no embeddings endpoint or model, or a wrong answer."""


@dataclass(frozen=True, slots=True)
class EmbeddingModel:
    """Where vectors come from: a server's API address, its key, and the embedding model there."""

    base_url: str
    model: str
    api_key: str | None = None

    @property
    def key(self) -> str:
        """What the store files vectors under: vectors of two models never mix."""
        return f"{self.model} @ {self.base_url}"


class EmbeddingsClient:
    def __init__(self, source: EmbeddingModel, *, connect_timeout: float = 10.0,
                 response_timeout: float = EMBEDDINGS_TIMEOUT_S) -> None:
        self.source = source
        self._endpoint = Endpoint(source.base_url, source.api_key,
                                  connect_timeout=connect_timeout,
                                  response_timeout=response_timeout)

    async def embed(self, texts: Sequence[str]) -> np.ndarray:
        """One unit-length float32 row per text, in order."""
        if not texts:
            return np.zeros((0, 0), dtype=np.float32)
        if len(texts) > MAX_TEXTS:
            raise ValueError(f"at most {MAX_TEXTS} texts a request, not {len(texts)}")
        body = {"model": self.source.model, "encoding_format": "float",
                "input": [text[:MAX_TEXT_CHARS] or " " for text in texts]}
        try:
            answer = await self._endpoint.post_json("/embeddings", body,
                                                    max_bytes=MAX_ANSWER_BYTES)
        except ModelNotFoundError as exc:
            raise EmbeddingsError(
                f"{self._endpoint.url} gave no embeddings for {self.source.model!r} "
                f"({clause(exc)}). The server must serve an embedding model at /v1/embeddings "
                "(llama.cpp: llama-server --embeddings; vLLM: an embedding model; Ollama: "
                "ollama pull nomic-embed-text)") from None
        return unit_rows(vectors_of(answer, len(texts), self._endpoint.url))


def vectors_of(answer: object, count: int, url: str) -> np.ndarray:
    """The `count` vectors of an embeddings answer, by their index, as a float32 matrix."""
    data = answer.get("data") if isinstance(answer, dict) else None
    if not isinstance(data, list) or len(data) != count:
        got = len(data) if isinstance(data, list) else "no"
        raise MalformedStreamError(f"{url} answered /embeddings with {got} vectors for {count} "
                                   "texts: is it an OpenAI-compatible embeddings endpoint?")
    rows: list[list[float] | None] = [None] * count
    for position, item in enumerate(data):
        index = item.get("index", position) if isinstance(item, dict) else None
        vector = item.get("embedding") if isinstance(item, dict) else None
        if not isinstance(index, int) or not 0 <= index < count or rows[index] is not None:
            raise MalformedStreamError(f"{url} answered /embeddings with a vector whose index "
                                       f"({index!r}) is not one of the {count} texts'")
        rows[index] = _checked_vector(vector, url)
    widths = {len(row) for row in rows if row is not None}
    if len(widths) != 1:
        raise MalformedStreamError(f"{url} answered /embeddings with vectors of different "
                                   f"widths ({sorted(widths)})")
    return np.asarray(rows, dtype=np.float32)


def _checked_vector(vector: object, url: str) -> list[float]:
    if (not isinstance(vector, list) or not 0 < len(vector) <= MAX_DIMENSIONS
            or not all(isinstance(x, int | float) and not isinstance(x, bool)
                       and math.isfinite(x) for x in vector)):
        raise MalformedStreamError(
            f"{url} answered /embeddings with something that is not a vector of at most "
            f"{MAX_DIMENSIONS:,} finite numbers (encoding_format float was asked)")
    return vector


def unit_rows(matrix: np.ndarray) -> np.ndarray:
    """Each row scaled to length 1 (a zero row stays zero)."""
    norms = np.linalg.norm(matrix, axis=1, keepdims=True)
    return (matrix / np.where(norms > 0, norms, 1)).astype(np.float32)
