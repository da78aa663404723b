"""The FastAPI application: routes, error shapes, key, body limit and CORS over a model source."""

from __future__ import annotations

from dataclasses import dataclass

from fastapi import FastAPI, Request
from fastapi.middleware.cors import CORSMiddleware
from fastapi.responses import JSONResponse, Response

from pagoda.engine.server.admission import DEFAULT_WORK_CONTEXTS, WorkBudget
from pagoda.engine.server.chat import create_chat_completion
from pagoda.engine.server.completions import create_completion
from pagoda.engine.server.embeddings import create_embeddings
from pagoda.engine.server.errors import APIError, install_handlers
from pagoda.engine.server.messages import count_tokens, create_message
from pagoda.engine.server.messages_protocol import CountTokensRequest, MessagesRequest
from pagoda.engine.server.metrics import CONTENT_TYPE, CountingMiddleware, ServerMetrics
from pagoda.engine.server.protocol import (
    ChatCompletionRequest,
    CompletionRequest,
    DetokenizeRequest,
    EmbeddingRequest,
    TokenizeRequest,
)
from pagoda.engine.server.responses import create_response
from pagoda.engine.server.responses_protocol import ResponsesRequest
from pagoda.engine.server.responses_store import ResponseStore
from pagoda.engine.server.security import (
    DEFAULT_MAX_BODY_BYTES,
    APIKeyMiddleware,
    BodyLimitMiddleware,
    HostCheckMiddleware,
    is_loopback,
    key_digest,
)
from pagoda.engine.server.served import ModelSource, ServedModel
from pagoda.engine.server.shutdown import LiveRequests
from pagoda.engine.server.streams import ClientDisconnected
from pagoda.engine.server.tokenize import detokenize, tokenize


@dataclass(frozen=True, slots=True)
class ServerSettings:
    """api_key, or only its SHA-256 (api_key_sha256, what the app keeps): either turns the key
    check on for every route but /health and /metrics. listen_host: the address the server
    listens on; on loopback, requests must name a loopback host or one of allowed_hosts ("*":
    any). max_work_contexts: how much work (prompt and max_tokens of every
    choice, in full contexts of the model) the requests in progress may hold; beyond it a
    request is answered 429 (see pagoda.engine.server.admission)."""

    api_key: str | None = None
    api_key_sha256: str | None = None
    allowed_origins: tuple[str, ...] = ()
    listen_host: str = "127.0.0.1"
    allowed_hosts: tuple[str, ...] = ()
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES
    max_work_contexts: int = DEFAULT_WORK_CONTEXTS

    @property
    def key_sha256(self) -> str | None:
        return key_digest(self.api_key) if self.api_key else self.api_key_sha256

    @property
    def checks_host(self) -> bool:
        """A server on another address needs a key, and answers to whatever name the network
        gives it; one on loopback may have no key, which DNS rebinding would get around."""
        return is_loopback(self.listen_host) and "*" not in self.allowed_hosts


def build_app(source: ModelSource, settings: ServerSettings | None = None) -> FastAPI:
    settings = settings or ServerSettings()
    app = FastAPI(title="Pagoda", docs_url=None, redoc_url=None, openapi_url=None)
    app.state.metrics = ServerMetrics(source)
    app.state.work_budget = WorkBudget(settings.max_work_contexts)
    app.state.responses = ResponseStore()
    live = LiveRequests()
    app.state.end_requests = live.end_all  # what the runner calls when the server stops
    install_handlers(app)
    _add_routes(app, live.tracked(source))
    _add_middleware(app, settings)
    return app


def running_requests(app: FastAPI) -> int:
    """API requests in progress (a streamed one until its last chunk)."""
    return app.state.metrics.running.value


def _add_middleware(app: FastAPI, settings: ServerSettings) -> None:
    # The last added runs first: the Host, CORS answers preflights, then the key, then the body
    # limit.
    app.add_middleware(CountingMiddleware, counter=app.state.metrics.running)
    app.add_middleware(BodyLimitMiddleware, max_bytes=settings.max_body_bytes)
    if settings.key_sha256:
        app.add_middleware(APIKeyMiddleware, key_sha256=settings.key_sha256)
    if settings.allowed_origins:
        app.add_middleware(CORSMiddleware, allow_origins=list(settings.allowed_origins),
                           allow_methods=["GET", "POST", "DELETE", "OPTIONS"],
                           allow_headers=["Authorization", "Content-Type", "x-api-key",
                                          "anthropic-version"])
    if settings.checks_host:
        app.add_middleware(HostCheckMiddleware, allowed=settings.allowed_hosts)


def _served(source: ModelSource, requested: str | None) -> ServedModel:
    served = source()
    if served is None:
        raise APIError(503, "no model is loaded yet: try again in a moment", code="model_loading")
    if requested is not None and requested != served.name:
        raise APIError(404, f"the model {requested!r} does not exist: this server serves "
                            f"{served.name!r} (see GET /v1/models)", param="model",
                       code="model_not_found")
    return served


def _no_query(request: Request) -> None:
    """GET and DELETE of a stored response take no options (OpenAI's `include` or `stream`
    would change the answer): refused rather than dropped."""
    for name in request.query_params:
        raise APIError(400, f"the query parameter {name!r} is not supported by this server: "
                            "a stored response is returned whole, as it was made", param=name)


def _add_routes(app: FastAPI, source: ModelSource) -> None:
    metrics: ServerMetrics = app.state.metrics
    budget: WorkBudget = app.state.work_budget
    stored: ResponseStore = app.state.responses

    @app.get("/health")
    async def health() -> Response:
        served = source()
        if served is None:
            return JSONResponse({"status": "loading"}, status_code=503)
        try:
            served.backend.check_health()
        except Exception as exc:  # noqa: BLE001 - a dead engine is what /health reports
            return JSONResponse({"status": "error", "reason": str(exc)}, status_code=503)
        return JSONResponse({"status": "ok", "model": served.name})

    @app.get("/metrics")
    async def prometheus() -> Response:
        return Response(metrics.render(), media_type=CONTENT_TYPE)

    @app.get("/v1/models")
    async def models() -> dict:
        served = source()
        return {"object": "list", "data": [] if served is None else [served.card()]}

    @app.get("/v1/models/{model_id:path}")
    async def model(model_id: str) -> dict:
        return _served(source, model_id).card()

    @app.post("/v1/chat/completions")
    async def chat(body: ChatCompletionRequest, request: Request):
        return await create_chat_completion(body, request, _served(source, body.model), metrics,
                                            budget)

    @app.post("/v1/completions")
    async def completions(body: CompletionRequest, request: Request):
        return await create_completion(body, request, _served(source, body.model), metrics,
                                       budget)

    @app.post("/v1/responses")
    async def responses(body: ResponsesRequest, request: Request):
        return await create_response(body, request, _served(source, body.model), metrics,
                                     budget, stored)

    @app.post("/v1/messages")
    async def messages(body: MessagesRequest, request: Request):
        return await create_message(body, request, _served(source, body.model), metrics, budget)

    @app.post("/v1/messages/count_tokens")
    async def message_tokens(body: CountTokensRequest) -> dict:
        return await count_tokens(body, _served(source, body.model))

    @app.get("/v1/responses/{response_id}")
    async def get_response(response_id: str, request: Request) -> dict:
        _no_query(request)
        return stored.get(response_id).body

    @app.delete("/v1/responses/{response_id}")
    async def delete_response(response_id: str, request: Request) -> dict:
        _no_query(request)
        stored.delete(response_id)
        return {"id": response_id, "object": "response.deleted", "deleted": True}

    @app.post("/v1/embeddings")
    async def embeddings(body: EmbeddingRequest, request: Request):
        return await create_embeddings(body, request, _served(source, body.model), metrics,
                                       budget)

    @app.post("/tokenize")
    async def prompt_tokens(body: TokenizeRequest) -> dict:
        return await tokenize(body, _served(source, body.model))

    @app.post("/detokenize")
    async def spell_tokens(body: DetokenizeRequest) -> dict:
        return await detokenize(body, _served(source, body.model))

    @app.exception_handler(ClientDisconnected)
    async def _gone(_request: Request, _exc: ClientDisconnected) -> Response:
        return Response(status_code=499)  # nobody reads it; the requests were aborted
