"""A server's requests in the engine, ended with their last chunk when the server stops."""

from __future__ import annotations

import contextlib
import dataclasses
import uuid
from collections.abc import AsyncIterator, Sequence
from typing import Any

from pagoda.engine.multimodal.images import DecodedImage
from pagoda.engine.outputs import RequestOutput
from pagoda.engine.sampling.params import PoolingParams, SamplingParams
from pagoda.engine.server.errors import APIError
from pagoda.engine.server.served import EngineBackend, ModelSource, ServedModel
from pagoda.engine.text.chat_template import Message


class LiveRequests:
    """The engine requests this server started and has not seen end.

    A stop aborts them (`end_all`), so each ends as an engine abort does: a streamed reply with a
    last chunk of finish_reason "abort" and `data: [DONE]`, a whole one with what it has, an
    embeddings request with a 503 (it has no vectors to give); the engine itself, which the app
    shares with its tabs, serves on. Requests that come after are refused with 503.
    """

    def __init__(self) -> None:
        self.closing = False
        self._live: dict[str, EngineBackend] = {}

    def end_all(self) -> int:
        """Refuse new requests from now on and abort the live ones; returns how many."""
        self.closing = True
        for request_id, backend in list(self._live.items()):
            backend.abort(request_id)
        return len(self._live)

    def tracked(self, source: ModelSource) -> ModelSource:
        """`source` whose model's streams are tracked here."""
        def served() -> ServedModel | None:
            model = source()
            if model is None:
                return None
            return dataclasses.replace(model, backend=_TrackedBackend(model.backend, self))
        return served

    async def stream(self, backend: EngineBackend, prompt: str | list[int] | Sequence[Message],
                     params: SamplingParams | None, request_id: str | None,
                     images: Sequence[DecodedImage] = ()) -> AsyncIterator[RequestOutput]:
        self._check_open()
        request_id = request_id or f"api-{uuid.uuid4().hex}"
        self._live[request_id] = backend
        aborted = False
        try:
            async with contextlib.aclosing(backend.stream(prompt, params, request_id,
                                                          images=images)) as outs:
                async for out in outs:
                    # A request that reached the engine after end_all (it was still being
                    # tokenized) missed its abort: it gets it now.
                    if self.closing and not out.finished and not aborted:
                        backend.abort(request_id)
                        aborted = True
                    yield out
        finally:
            self._live.pop(request_id, None)

    async def embed(self, backend: EngineBackend, prompts: Sequence[list[int]],
                    params: PoolingParams | None, request_id: str | None) -> list[list[float]]:
        """The backend's embed, each prompt's request known here until the vectors are made
        (an abort makes the backend raise RequestAbortedError)."""
        self._check_open()
        request_id = request_id or f"api-{uuid.uuid4().hex}"
        request_ids = [f"{request_id}-{i}" for i in range(len(prompts))]
        self._live.update(dict.fromkeys(request_ids, backend))
        try:
            return await backend.embed(prompts, params, request_id)
        finally:
            for rid in request_ids:
                self._live.pop(rid, None)

    def _check_open(self) -> None:
        if self.closing:
            raise APIError(503, "the server is shutting down: retry once it is back",
                           code="server_stopping")


class _TrackedBackend:
    """An engine backend whose streams `live` knows of while they run; all else (its chat
    tokenizer, stats, health, abort) is the backend's own."""

    def __init__(self, backend: EngineBackend, live: LiveRequests) -> None:
        self._backend = backend
        self._live = live

    def stream(self, prompt: str | list[int] | Sequence[Message],
               params: SamplingParams | None = None, request_id: str | None = None,
               images: Sequence[DecodedImage] = ()) -> AsyncIterator[RequestOutput]:
        return self._live.stream(self._backend, prompt, params, request_id, images)

    async def embed(self, prompts: Sequence[list[int]], params: PoolingParams | None = None,
                    request_id: str | None = None) -> list[list[float]]:
        return await self._live.embed(self._backend, prompts, params, request_id)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._backend, name)
