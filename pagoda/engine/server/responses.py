"""POST /v1/responses (OpenAI's Responses API): the request becomes a chat request
(pagoda/engine/server/responses_input.py, responses_chat.py), which the chat endpoint's code checks,
encodes and runs (pagoda/engine/server/chat.py); its reply comes back as output items, whole or as
typed SSE events (pagoda/engine/server/responses_stream.py), and is kept for previous_response_id
(pagoda/engine/server/responses_store.py)."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from dataclasses import dataclass

from starlette.requests import Request

from pagoda.engine.outputs import RequestOutput
from pagoda.engine.parsers.replies import ReplyShape
from pagoda.engine.server.admission import WorkBudget
from pagoda.engine.server.chat import PreparedChat, prepare_chat
from pagoda.engine.server.errors import APIError
from pagoda.engine.server.generation import (
    Generation,
    finish_reason,
    item_id,
    respond,
    sse_event,
    usage,
)
from pagoda.engine.server.metrics import ServerMetrics
from pagoda.engine.server.protocol import ChatMessage
from pagoda.engine.server.responses_chat import chat_request, responses_errors
from pagoda.engine.server.responses_input import input_messages, output_messages
from pagoda.engine.server.responses_protocol import ResponsesRequest
from pagoda.engine.server.responses_store import ResponseStore, StoredResponse
from pagoda.engine.server.responses_stream import ResponseEvents
from pagoda.engine.server.served import ServedModel


@dataclass(slots=True, frozen=True)
class Turn:
    """What one request adds to the conversation, and the history it continues."""

    history: tuple[ChatMessage, ...]
    added: tuple[ChatMessage, ...]


async def create_response(body: ResponsesRequest, request: Request, served: ServedModel,
                          metrics: ServerMetrics, budget: WorkBudget, store: ResponseStore):
    body.check_supported()
    turn = _turn(body, store)
    response_id = item_id("resp")
    with responses_errors():
        chat = chat_request(body, [*_instructions(body), *turn.history, *turn.added])
        prepared = await prepare_chat(chat, request, served, metrics, budget, response_id)
    finished = _Finisher(body, turn, prepared, served.name, store)
    with responses_errors():
        return await respond(prepared.generation, request, body.stream,
                             lambda: _events(prepared.shape, finished),
                             lambda finals: finished.whole(finals[0]))


def _turn(body: ResponsesRequest, store: ResponseStore) -> Turn:
    if body.previous_response_id is None:
        if body.input is None:
            raise APIError(400, "input is missing: give the input, or a previous_response_id "
                                "to continue", param="input")
        return Turn((), tuple(input_messages(body.input, ())))
    history = store.get(body.previous_response_id, "previous_response_id").conversation
    return Turn(history, () if body.input is None else tuple(input_messages(body.input, history)))


def _instructions(body: ResponsesRequest) -> list[ChatMessage]:
    """The instructions, first; a previous response's are not carried on (OpenAI's rule)."""
    return [] if body.instructions is None else [ChatMessage(role="system",
                                                             content=body.instructions)]


class _Finisher:
    """A response's object once its reply is read, kept in the store when asked (store)."""

    def __init__(self, body: ResponsesRequest, turn: Turn, prepared: PreparedChat,
                 model: str, store: ResponseStore) -> None:
        self.body = body
        self.turn = turn
        self.prepared = prepared
        self.model = model
        self.store = store

    @property
    def id(self) -> str:
        return self.prepared.generation.request_id

    def snapshot(self, status: str, output: list[dict], final: RequestOutput | None) -> dict:
        """The response object: in progress (no output yet), or done."""
        generation = self.prepared.generation
        reason = None if final is None else finish_reason(final)
        body = {
            "id": self.id, "object": "response", "created_at": generation.created,
            "status": status, "model": self.model, "output": output, "error": None,
            "incomplete_details": {"reason": "max_output_tokens"} if reason == "length" else None,
            "usage": None if final is None else _usage(final, generation, self.prepared.shape),
            **self.body.echo(),
        }
        if status == "completed":
            body["completed_at"] = int(time.time())
        return body

    def whole(self, final: RequestOutput) -> dict:
        events = ResponseEvents()
        reply = self.prepared.shape.streamer()
        events.feed(reply.feed(final.outputs[0].text))
        events.feed(reply.finish())
        status = status_of(final)
        events.finish(_item_status(status))
        return self.done(status, events.items, final)

    def done(self, status: str, output: list[dict], final: RequestOutput) -> dict:
        body = self.snapshot(status, output, final)
        if self.body.store:
            conversation = (*self.turn.history, *self.turn.added, *output_messages(output))
            self.store.put(StoredResponse(body, conversation))
        return body


# The event that ends a stream, by the response's status: a reply the server stopped (it is
# shutting down) has no event of its own in OpenAI's set, so it ends as a failure would.
_LAST_EVENT = {"completed": "response.completed", "incomplete": "response.incomplete",
               "cancelled": "response.failed"}


def status_of(final: RequestOutput) -> str:
    return {"stop": "completed", "length": "incomplete"}.get(finish_reason(final), "cancelled")


def _item_status(status: str) -> str:
    return "completed" if status == "completed" else "incomplete"


def _usage(final: RequestOutput, generation: Generation, shape: ReplyShape) -> dict:
    counts = usage([final], generation.choices)
    reasoning = shape.reasoning_tokens(final.outputs[0].token_ids,
                                       generation.served.backend.token_text)
    cached = counts["prompt_tokens_details"]["cached_tokens"]
    # What the prompt computed goes into the prefix cache: the tokens it did not find there.
    written = counts["prompt_tokens"] - cached
    return {"input_tokens": counts["prompt_tokens"],
            "input_tokens_details": {"cached_tokens": cached, "cache_write_tokens": written},
            "output_tokens": counts["completion_tokens"],
            "output_tokens_details": {"reasoning_tokens": reasoning},
            "total_tokens": counts["total_tokens"]}


async def _events(shape: ReplyShape, finished: _Finisher) -> AsyncIterator[str]:
    """The typed events of a streamed response: created, in progress, each item's, and
    completed (or incomplete); an engine failure is an error event."""
    events = ResponseEvents()
    reply = shape.streamer()
    progress = finished.snapshot("in_progress", [], None)
    yield sse_event(events.event("response.created", response=progress))
    yield sse_event(events.event("response.in_progress", response=progress))
    final = None
    try:
        async for _, out in finished.prepared.generation.events():
            sent = events.feed(reply.feed(out.outputs[0].delta_text))
            if out.finished:
                final = out
                sent += events.feed(reply.finish())
            for event in sent:
                yield sse_event(event)
        status = status_of(final)
    except APIError as exc:
        error = exc.body()["error"]
        yield sse_event(events.event("error", code=error["code"], message=error["message"],
                                     param=error["param"]))
        return
    for event in events.finish(_item_status(status)):
        yield sse_event(event)
    body = finished.done(status, events.items, final)
    yield sse_event(events.event(_LAST_EVENT[status], response=body))
