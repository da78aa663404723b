"""A scripted "thinking, tool-calling model" behind an OpenAI-compatible API, for the GUI bench.

    .venv/bin/python bench/scripted_tool_model.py --port 8123 [--thinking-pieces 400]
                                                  [--answer-pieces 200] [--piece-ms 10]
                                                  [--hang-s 3]

It streams as vLLM does (server-sent chat.completion.chunk events, `reasoning_content` deltas,
tool calls by index with their id and name first and their arguments after, finish_reason on a
chunk of its own, usage in a last chunk with no choices) and answers each turn of a chat by the
number of tool results since the user's last message:

    0: thinks (`--thinking-pieces` reasoning deltas), then calls `clock` {}
    1: calls `hang` {"seconds": --hang-s}
    2 or more: answers (`--answer-pieces` content deltas)

one delta every `--piece-ms`. The reply is the script whatever the sampling fields say; a request
it cannot follow (no `clock`/`hang` among its tools when it should call one, a max_tokens below
the scripted reply, a last message that is neither the user's nor a tool result) is refused
with a 400 in vLLM's error shape, naming what is missing. Not a test server: the tests have
tests/app/backends/fake_server.py.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
from dataclasses import dataclass

import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

MODEL = "scripted-thinker"
MAX_MODEL_LEN = 32768
THOUGHT = ("The user wants to know the time on the server and then to wait a little, so I "
           "should call the clock tool first and read what it says before I go on.")
ANSWER = ("The server's clock answered, and the wait is over: here is what I found, written "
          "out as a short answer with a few words more than needed.")


@dataclass(slots=True, frozen=True)
class Script:
    thinking_pieces: int = 400
    answer_pieces: int = 200
    piece_s: float = 0.01
    hang_s: float = 3.0


@dataclass(slots=True, frozen=True)
class Step:
    """What one reply streams: reasoning pieces, content pieces, then at most one call."""

    reasoning: tuple[str, ...] = ()
    content: tuple[str, ...] = ()
    call: tuple[str, dict] | None = None

    @property
    def tokens(self) -> int:
        return len(self.reasoning) + len(self.content) + (self.call is not None)


class RefusedRequest(Exception):
    """A request the script cannot follow; its message says why."""


def next_step(body: dict, script: Script) -> Step:
    """The reply to this request: what the script does after this many tool results."""
    messages = body.get("messages") or []
    last = messages[-1].get("role") if messages else None
    if last not in ("user", "tool"):
        raise RefusedRequest(f"the last message is a {last!r} one: the script answers the "
                             "user's message or a tool's result")
    results = 0
    for message in reversed(messages):
        if message.get("role") == "user":
            break
        results += message.get("role") == "tool"
    if results == 0:
        step = Step(reasoning=_pieces(THOUGHT, script.thinking_pieces), call=("clock", {}))
    elif results == 1:
        step = Step(call=("hang", {"seconds": script.hang_s}))
    else:
        step = Step(content=_pieces(ANSWER, script.answer_pieces))
    _check_request(body, step)
    return step


def _pieces(text: str, n: int) -> tuple[str, ...]:
    """`n` pieces of `text`, a word and its space each, from its start again when it runs out."""
    return tuple(f"{word} " for word in itertools.islice(itertools.cycle(text.split()), n))


def _check_request(body: dict, step: Step) -> None:
    offered = {tool.get("function", {}).get("name") for tool in body.get("tools") or []}
    if step.call is not None and step.call[0] not in offered:
        raise RefusedRequest(f"the script calls {step.call[0]!r}, which this request does not "
                             f"offer (its tools: {sorted(filter(None, offered)) or 'none'})")
    max_tokens = body.get("max_tokens")
    if max_tokens is not None and max_tokens < step.tokens:
        raise RefusedRequest(f"max_tokens={max_tokens} is below the scripted reply's "
                             f"{step.tokens} tokens: raise the chat's max tokens")


class ScriptedModel:
    """The FastAPI app: /health, /v1/models, /tokenize and /v1/chat/completions."""

    def __init__(self, script: Script) -> None:
        self.script = script
        self._call_ids = itertools.count()

    def app(self) -> FastAPI:
        app = FastAPI()
        app.get("/health")(self._health)
        app.get("/v1/models")(self._models)
        app.post("/tokenize")(self._tokenize)
        app.post("/v1/chat/completions")(self._chat)
        return app

    async def _health(self) -> Response:
        return Response(status_code=200)

    async def _models(self) -> Response:
        return JSONResponse({"object": "list", "data": [
            {"id": MODEL, "object": "model", "owned_by": "vllm", "max_model_len": MAX_MODEL_LEN}]})

    async def _tokenize(self, request: Request) -> Response:
        body = await request.json()
        return JSONResponse({"count": prompt_tokens(body.get("messages") or []),
                             "max_model_len": MAX_MODEL_LEN, "tokens": []})

    async def _chat(self, request: Request) -> Response:
        body = await request.json()
        if body.get("model") != MODEL:
            return _error(404, f"The model `{body.get('model')}` does not exist.")
        if not body.get("stream"):
            return _error(400, "the scripted model only streams: send stream=true")
        try:
            step = next_step(body, self.script)
        except RefusedRequest as exc:
            return _error(400, str(exc))
        prompt = prompt_tokens(body["messages"])
        return StreamingResponse(self._events(step, prompt), media_type="text/event-stream")

    async def _events(self, step: Step, prompt: int):
        yield _sse(_chunk({"role": "assistant", "content": ""}))
        for piece in step.reasoning:
            await asyncio.sleep(self.script.piece_s)
            yield _sse(_chunk({"reasoning_content": piece}))
        for piece in step.content:
            await asyncio.sleep(self.script.piece_s)
            yield _sse(_chunk({"content": piece}))
        finish = "stop"
        if step.call is not None:
            await asyncio.sleep(self.script.piece_s)
            name, arguments = step.call
            call_id = f"chatcmpl-tool-{next(self._call_ids)}"
            yield _sse(_chunk({"tool_calls": [{"index": 0, "id": call_id, "type": "function",
                                               "function": {"name": name, "arguments": ""}}]}))
            yield _sse(_chunk({"tool_calls": [{"index": 0, "function": {
                "arguments": json.dumps(arguments)}}]}))
            finish = "tool_calls"
        yield _sse(_chunk({}, finish))
        usage = {"prompt_tokens": prompt, "completion_tokens": step.tokens,
                 "total_tokens": prompt + step.tokens}
        yield _sse({**_chunk({}), "choices": [], "usage": usage})
        yield "data: [DONE]\n\n"


def prompt_tokens(messages: list[dict]) -> int:
    """About four characters a token, as an estimate (the script has no tokenizer)."""
    return sum(len(m.get("content") or "") // 4 + 4 for m in messages)


def _chunk(delta: dict, finish: str | None = None) -> dict:
    return {"id": "chatcmpl-scripted", "object": "chat.completion.chunk", "created": 0,
            "model": MODEL, "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}


def _sse(payload: dict) -> str:
    return f"data: {json.dumps(payload)}\n\n"


def _error(status: int, message: str) -> JSONResponse:
    return JSONResponse({"object": "error", "message": message, "type": "BadRequestError",
                         "param": None, "code": status}, status_code=status)


def main() -> None:
    defaults = Script()
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--thinking-pieces", type=int, default=defaults.thinking_pieces)
    parser.add_argument("--answer-pieces", type=int, default=defaults.answer_pieces)
    parser.add_argument("--piece-ms", type=float, default=defaults.piece_s * 1000)
    parser.add_argument("--hang-s", type=float, default=defaults.hang_s)
    args = parser.parse_args()
    script = Script(args.thinking_pieces, args.answer_pieces, args.piece_ms / 1000, args.hang_s)
    uvicorn.run(ScriptedModel(script).app(), host=args.host, port=args.port,
                log_level="warning")


if __name__ == "__main__":
    main()
