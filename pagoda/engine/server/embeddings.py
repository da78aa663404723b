"""POST /v1/embeddings: OpenAI's embeddings of texts or token ids, made by the served model as
pooling requests on its engine (the mean of the final-normed hidden states, L2-normalised:
see pagoda.engine.sampling.params.PoolingParams)."""

from __future__ import annotations

import base64
import logging
import struct

from fastapi.responses import JSONResponse
from starlette.requests import Request

from pagoda.engine.server.admission import WorkBudget
from pagoda.engine.server.errors import APIError, as_api_errors
from pagoda.engine.server.generation import new_id
from pagoda.engine.server.metrics import ServerMetrics
from pagoda.engine.server.protocol import MAX_EMBEDDING_INPUTS, MAX_EMBEDDING_TOKENS, EmbeddingRequest
from pagoda.engine.server.served import ServedModel
from pagoda.engine.server.streams import until_disconnected

logger = logging.getLogger(__name__)


async def create_embeddings(body: EmbeddingRequest, request: Request, served: ServedModel,
                            metrics: ServerMetrics, budget: WorkBudget) -> JSONResponse:
    body.check_supported()
    _check_dimensions(body.dimensions, served.backend.hidden_size)
    inputs = body.inputs()
    _check_inputs(body, inputs)
    token_ids = await _tokens(body, inputs, served)
    num_tokens = _check_lengths(body, token_ids, served.max_model_len, budget)
    request_id = new_id("embd")
    if body.user is not None:
        logger.debug("%s is for user %r", request_id, body.user)
    admission = budget.admit(num_tokens, served.max_model_len)
    try:
        with as_api_errors("input"):
            vectors = await until_disconnected(
                request, lambda: served.backend.embed(token_ids, request_id=request_id))
    finally:
        admission.release()
    metrics.observe_pooled(num_tokens, len(vectors))
    return JSONResponse(_response(vectors, body.encoding_format, served.name, num_tokens))


def _check_dimensions(dimensions: int | None, hidden_size: int) -> None:
    if dimensions is not None and dimensions != hidden_size:
        raise APIError(400, f"dimensions={dimensions} is not supported by this server: this "
                            f"model's vectors have {hidden_size} dimensions, and it was not "
                            "trained for shortened ones; leave dimensions out or give "
                            f"{hidden_size}", param="dimensions")


def _check_inputs(body: EmbeddingRequest, inputs: list[str | list[int]]) -> None:
    """Refuse what holds nothing to embed, or too many inputs, before anything is encoded."""
    if not inputs:
        raise APIError(400, "input is empty: give a text, token ids, or a list of either",
                       param="input")
    if len(inputs) > MAX_EMBEDDING_INPUTS:
        raise APIError(400, f"input holds {len(inputs)} inputs; this server embeds at most "
                            f"{MAX_EMBEDDING_INPUTS} per request: send them in several requests",
                       param="input")
    for i, given in enumerate(inputs):
        if not given:
            what = "an empty string" if isinstance(given, str) else "an empty list of token ids"
            raise APIError(400, f"{body.input_field(i)} is {what}: every input needs at least "
                                "one token", param=body.input_field(i))


async def _tokens(body: EmbeddingRequest, inputs: list[str | list[int]],
                  served: ServedModel) -> list[list[int]]:
    """Texts encoded off the server's loop (a text far over the context is refused before it
    is), token ids as given."""
    tokens = []
    for i, given in enumerate(inputs):
        field = body.input_field(i)
        with as_api_errors(field):
            tokens.append(given if isinstance(given, list) else
                          await served.backend.chat_tokenizer.encode_text(given, field))
    return tokens


def _check_lengths(body: EmbeddingRequest, token_ids: list[list[int]], max_model_len: int,
                   budget: WorkBudget) -> int:
    """The inputs' tokens all together, once each fits the context and all fit one request."""
    for i, ids in enumerate(token_ids):
        if len(ids) > max_model_len:
            raise APIError(400, f"{body.input_field(i)} has {len(ids)} tokens, more than the "
                                f"model's context of {max_model_len}: shorten it or split it",
                           param=body.input_field(i), code="context_length_exceeded")
    total = sum(len(ids) for ids in token_ids)
    limit = min(MAX_EMBEDDING_TOKENS, budget.limit(max_model_len))
    if total > limit:
        raise APIError(400, f"the inputs have {total} tokens together; this server embeds at "
                            f"most {limit} per request: send them in several requests",
                       param="input", code="request_too_large")
    return total


def _response(vectors: list[list[float]], encoding_format: str, model: str,
              num_tokens: int) -> dict:
    data = [{"object": "embedding", "index": i, "embedding": _encoded(vector, encoding_format)}
            for i, vector in enumerate(vectors)]
    return {"object": "list", "data": data, "model": model,
            "usage": {"prompt_tokens": num_tokens, "total_tokens": num_tokens}}


def _encoded(vector: list[float], encoding_format: str) -> list[float] | str:
    """The vector as numbers, or as OpenAI's base64: its little-endian float32 bytes."""
    if encoding_format == "float":
        return vector
    return base64.b64encode(struct.pack(f"<{len(vector)}f", *vector)).decode("ascii")
