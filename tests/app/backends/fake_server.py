"""A small OpenAI-compatible server whose streaming shape and faults a test chooses.

Two shapes of the servers Pagoda meets: vLLM's (finish_reason on the last content chunk, usage
in a chunk of its own with no choices, /tokenize, max_model_len in /v1/models) and llama.cpp's
(finish_reason on a chunk of its own carrying the usage; its context as `meta.n_ctx` in
/v1/models and as `n_ctx` and `default_generation_settings.n_ctx` in /props, each of which a
test can take away, as older builds lack them). Both send
keep-alive comments; llama.cpp's shape reports its reading of the prompt when asked
(`return_progress`). The reply is a fixed list of pieces, one token each, cut by max_tokens and
stop strings as a real server would; or, where a test gives `script`, the chunks recorded from
a server (tool calls, reasoning), sent as they are.
"""

from __future__ import annotations

import asyncio
import json
import threading
from dataclasses import dataclass, field

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

MODEL = "fake-model"
PIECES = ["Hello", " there", "!", " I", " am", " a", " fake", " server", "."]
REPLY = "".join(PIECES)
N_CTX = 2048
# Where llama.cpp's current builds report the context they run with.
LLAMA_CPP_CONTEXT = ("meta", "props", "props_settings")


@dataclass(slots=True)
class Shape:
    owned_by: str
    max_model_len: int | None
    finish_on_last_content: bool
    usage_chunk_of_its_own: bool
    tokenize: bool
    context_at: tuple[str, ...] = ()


VLLM = Shape("vllm", N_CTX, finish_on_last_content=True, usage_chunk_of_its_own=True,
             tokenize=True)
LLAMA_CPP = Shape("llamacpp", None, finish_on_last_content=False, usage_chunk_of_its_own=False,
                  tokenize=False, context_at=LLAMA_CPP_CONTEXT)


@dataclass(slots=True)
class Fault:
    """What goes wrong, if anything. `*_after`: after that many pieces."""

    status: int | None = None
    body: dict | str | None = None
    malformed_after: int | None = None
    error_after: int | None = None
    drop_after: int | None = None
    close_after: int | None = None
    endless: bool = False
    delay_s: float = 0.0
    not_a_stream: bool = False


class _Dropped(Exception):
    """Raised in the body to make uvicorn cut the connection mid-reply."""


@dataclass(slots=True)
class FakeServer:
    shape: Shape
    api_key: str | None = None
    fault: Fault = field(default_factory=Fault)
    requests: list[dict] = field(default_factory=list)
    stream_closed: threading.Event = field(default_factory=threading.Event)
    # Where this server reports its context length (N_CTX by default): see LLAMA_CPP_CONTEXT.
    context_at: tuple[str, ...] = ()
    n_ctx: int = N_CTX
    # Chunks to send in place of the pieces: each a chat.completion.chunk's `choices[0]`
    # ({"delta", "finish_reason"}), or a whole payload where it has "choices" or "usage".
    script: list[dict] | None = None

    def __post_init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        self.context_at = self.shape.context_at
        self.n_ctx = N_CTX
        self.script = None
        self.api_key = None
        self.fault = Fault()
        self.requests.clear()
        self.stream_closed.clear()

    def app(self) -> FastAPI:
        app = FastAPI()
        app.get("/v1/models")(self._models)
        app.post("/v1/chat/completions")(self._chat)
        app.post("/tokenize")(self._tokenize)
        app.get("/props")(self._props)
        return app

    async def _models(self, request: Request) -> Response:
        if (refusal := self._check_key(request)) is not None:
            return refusal
        entry = {"id": MODEL, "object": "model", "owned_by": self.shape.owned_by}
        if self.shape.max_model_len is not None:
            entry["max_model_len"] = self.shape.max_model_len
        if self.shape is LLAMA_CPP:
            # n_ctx_train is what the model was trained on, not what the server runs with.
            entry["meta"] = {"n_ctx_train": 8 * self.n_ctx, "n_vocab": 49152}
            if "meta" in self.context_at:
                entry["meta"]["n_ctx"] = self.n_ctx
        other = {"id": "other-model", "object": "model", "owned_by": self.shape.owned_by}
        return JSONResponse({"object": "list", "data": [entry, other]})

    async def _props(self, request: Request) -> Response:
        if self.shape is not LLAMA_CPP:
            return JSONResponse({"detail": "Not Found"}, status_code=404)
        if (refusal := self._check_key(request)) is not None:
            return refusal
        props: dict = {"total_slots": 1, "model_path": f"/models/{MODEL}.gguf"}
        if "props" in self.context_at:
            props["n_ctx"] = self.n_ctx
        if "props_settings" in self.context_at:
            props["default_generation_settings"] = {"n_ctx": self.n_ctx, "temperature": 0.8}
        return JSONResponse(props)

    async def _tokenize(self, request: Request) -> Response:
        if not self.shape.tokenize:
            return JSONResponse({"detail": "Not Found"}, status_code=404)
        body = await request.json()
        return JSONResponse({"count": prompt_tokens(body["messages"]), "max_model_len": N_CTX,
                             "tokens": []})

    async def _chat(self, request: Request) -> Response:
        body = await request.json()
        self.requests.append(body)
        refusal = self._check_key(request) or self._refuse(body)
        if refusal is not None:
            return refusal
        if self.fault.not_a_stream:
            return JSONResponse({"choices": [{"index": 0, "message": {"content": REPLY}}]})
        return StreamingResponse(self._events(body), media_type="text/event-stream")

    def _check_key(self, request: Request) -> Response | None:
        if self.api_key and request.headers.get("authorization") != f"Bearer {self.api_key}":
            return JSONResponse({"error": "Unauthorized"}, status_code=401)
        return None

    def _refuse(self, body: dict) -> Response | None:
        f = self.fault
        if f.status is not None:
            content = f.body if isinstance(f.body, str) else json.dumps(f.body)
            return Response(content, status_code=f.status, media_type="application/json")
        if body.get("model") != MODEL:
            return _error(404, f"The model `{body.get('model')}` does not exist.")
        if not 0 <= body.get("temperature", 1.0) <= 2:
            return _error(400, "temperature must be in [0, 2]")
        n = prompt_tokens(body["messages"])
        if n > self.n_ctx:
            return self._too_long(n)
        return None

    def _too_long(self, n: int) -> Response:
        if self.shape is LLAMA_CPP:
            return JSONResponse({"error": {
                "code": 400, "type": "exceed_context_size_error",
                "message": "the request exceeds the available context size, try increasing it"}},
                status_code=400)
        return _error(400, f"This model's maximum context length is {N_CTX} tokens. However, "
                           f"your request has {n} input tokens.")

    async def _events(self, body: dict):
        try:
            yield ": ping\n\n"
            yield _sse(self._chunk({"role": "assistant", "content": ""}))
            if body.get("return_progress") and self.shape is LLAMA_CPP:
                for event in self._progress(prompt_tokens(body["messages"])):
                    yield event
            if self.script is not None:
                for event in self._scripted():
                    yield event
                return
            async for event in self._pieces(body):
                yield event
        finally:
            self.stream_closed.set()

    def _progress(self, total: int):
        """llama.cpp's chunks while it reads the prompt: half, then all of it."""
        for processed in (total // 2, total):
            yield _sse({**self._chunk({"role": "assistant", "content": None}), "prompt_progress": {
                "total": total, "cache": 0, "processed": processed, "time_ms": 5}})

    def _scripted(self):
        for item in self.script:
            if "choices" in item or "usage" in item:
                yield _sse({**self._chunk({}), **item})
            else:
                yield _sse(self._chunk(item.get("delta", {}), item.get("finish_reason")))
        yield "data: [DONE]\n\n"

    async def _pieces(self, body: dict):
        f = self.fault
        pieces, reason = reply_pieces(body, endless=f.endless)
        sent = 0
        for i, piece in enumerate(pieces):
            if f.delay_s:
                await asyncio.sleep(f.delay_s)
            if (fault := self._fault_at(sent)) is not None:
                if fault == "close":
                    return
                yield fault
                continue
            last = i == len(pieces) - 1
            finish = reason if last and self.shape.finish_on_last_content else None
            yield _sse(self._chunk({"content": piece}, finish))
            sent += 1
            if i % 3 == 2:
                yield ": keep-alive\n\n"
        async for event in self._ending(body, reason, sent):
            yield event

    def _fault_at(self, sent: int) -> str | None:
        f = self.fault
        if f.malformed_after == sent:
            return "data: {this is not json\n\n"
        if f.error_after == sent:
            return _sse({"error": {"message": "the engine died", "type": "InternalServerError",
                                   "code": 500}})
        if f.drop_after == sent:
            raise _Dropped
        if f.close_after == sent:
            return "close"
        return None

    async def _ending(self, body: dict, reason: str, sent: int):
        usage = {"prompt_tokens": prompt_tokens(body["messages"]), "completion_tokens": sent,
                 "total_tokens": prompt_tokens(body["messages"]) + sent}
        if self.shape.usage_chunk_of_its_own:
            if not self.shape.finish_on_last_content:
                yield _sse(self._chunk({}, reason))
            yield _sse({**self._chunk({}), "choices": [], "usage": usage})
        else:
            finish = None if self.shape.finish_on_last_content else reason
            yield _sse({**self._chunk({}, finish), "usage": usage})
        yield "data: [DONE]\n\n"

    def _chunk(self, delta: dict, finish: str | None = None) -> dict:
        return {"id": "chatcmpl-fake", "object": "chat.completion.chunk", "created": 0,
                "model": MODEL, "choices": [{"index": 0, "delta": delta,
                                             "finish_reason": finish}]}


def reply_pieces(body: dict, endless: bool = False) -> tuple[list[str], str]:
    """The pieces the fake sends for a request and its finish reason."""
    if endless:
        return [" more"] * 10_000, "length"
    pieces, text = [], ""
    for piece in PIECES[:body.get("max_tokens") or len(PIECES)]:
        for stop in body.get("stop") or []:
            if stop in text + piece:
                cut = (text + piece).index(stop)
                return [*pieces, (text + piece)[len(text):cut]], "stop"
        pieces.append(piece)
        text += piece
    return pieces, "length" if len(pieces) < len(PIECES) else "stop"


def prompt_tokens(messages: list[dict]) -> int:
    return sum(len(m["content"] or "") // 4 + 4 for m in messages)


def _error(status: int, message: str) -> JSONResponse:
    # vLLM's ErrorResponse shape.
    return JSONResponse({"object": "error", "message": message, "type": "BadRequestError",
                         "param": None, "code": status}, status_code=status)


def _sse(payload: dict) -> str:
    return f"data: {json.dumps(payload)}\n\n"
