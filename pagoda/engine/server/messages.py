"""POST /v1/messages (Anthropic's Messages API) and /v1/messages/count_tokens: the request
becomes a chat request (pagoda/engine/server/messages_chat.py), which the chat endpoint's code checks,
encodes and runs (pagoda/engine/server/chat.py); its reply comes back as content blocks, whole or as
Anthropic's SSE events (pagoda/engine/server/messages_stream.py)."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass

from starlette.requests import Request

from pagoda.engine.outputs import RequestOutput
from pagoda.engine.server.admission import WorkBudget
from pagoda.engine.server.chat import PreparedChat, encode_chat_request, prepare_chat
from pagoda.engine.server.errors import APIError
from pagoda.engine.server.generation import finish_reason, item_id, respond, sse_event
from pagoda.engine.server.messages_chat import chat_request, conversation, messages_errors
from pagoda.engine.server.messages_protocol import CountTokensRequest, MessagesRequest
from pagoda.engine.server.messages_stream import MessageBlocks
from pagoda.engine.server.metrics import ServerMetrics
from pagoda.engine.server.served import ServedModel

logger = logging.getLogger(__name__)


@dataclass(slots=True, frozen=True)
class Stop:
    """Why a reply ended, in Anthropic's words."""

    reason: str  # end_turn, max_tokens, stop_sequence or tool_use
    sequence: str | None = None


async def create_message(body: MessagesRequest, request: Request, served: ServedModel,
                         metrics: ServerMetrics, budget: WorkBudget):
    body.check_supported()
    message_id = item_id("msg")
    if body.metadata is not None and body.metadata.user_id is not None:
        logger.debug("%s is for user %r", message_id, body.metadata.user_id)
    messages = conversation(body)
    with messages_errors():
        chat = chat_request(body, messages, served.backend.chat_template)
        prepared = await prepare_chat(chat, request, served, metrics, budget, message_id)
    reply = _Reply(body, prepared, served.name)
    with messages_errors():
        return await respond(prepared.generation, request, body.stream,
                             lambda: _events(reply), lambda finals: reply.whole(finals[0]))


async def count_tokens(body: CountTokensRequest, served: ServedModel) -> dict:
    """The prompt's tokens, by the model's template, as the same message would have them."""
    body.check_supported()
    messages = conversation(body)
    with messages_errors():
        chat = chat_request(body, messages, served.backend.chat_template)
        encoded = await encode_chat_request(chat, served)
    return {"input_tokens": len(encoded.prompt)}


class _Reply:
    """A message's object once its reply is read, and the parts its stream sends."""

    def __init__(self, body: MessagesRequest, prepared: PreparedChat, model: str) -> None:
        self.body = body
        self.prepared = prepared
        self.model = model

    def start(self, first: RequestOutput) -> dict:
        """The message as message_start announces it: no content, no stop yet."""
        return {"id": self.prepared.generation.request_id, "type": "message",
                "role": "assistant", "model": self.model, "content": [], "stop_reason": None,
                "stop_sequence": None, "usage": _usage(first)}

    def stop(self, final: RequestOutput, blocks: MessageBlocks) -> Stop:
        reason = finish_reason(final)
        if reason == "length":
            return Stop("max_tokens")
        if reason != "stop":
            raise APIError(503, "the server stopped this reply before its end (it is shutting "
                                "down): retry once it is back", code="request_aborted")
        if blocks.called:
            return Stop("tool_use")
        matched = final.outputs[0].stop_string
        if matched is not None and matched in (self.body.stop_sequences or ()):
            return Stop("stop_sequence", matched)
        return Stop("end_turn")

    def whole(self, final: RequestOutput) -> dict:
        blocks = MessageBlocks()
        reply = self.prepared.shape.streamer()
        blocks.feed(reply.feed(final.outputs[0].text))
        blocks.feed(reply.finish())
        blocks.finish()
        stop = self.stop(final, blocks)
        return {**self.start(final), "content": blocks.blocks, "stop_reason": stop.reason,
                "stop_sequence": stop.sequence}


def _usage(out: RequestOutput) -> dict:
    """Anthropic's counts: the prompt's tokens found in the prefix cache apart from those
    read anew (its input_tokens); the cache keeps every prompt, so none is a separate write."""
    cached = out.num_cached_tokens
    return {"input_tokens": len(out.prompt_token_ids) - cached,
            "cache_creation_input_tokens": 0, "cache_read_input_tokens": cached,
            "output_tokens": len(out.outputs[0].token_ids)}


async def _events(reply: _Reply) -> AsyncIterator[str]:
    """message_start once the reply begins, each block's events, message_delta with the stop
    and the usage, message_stop; an engine failure (or the server stopping the reply) is an
    error event."""
    blocks = MessageBlocks()
    stream = reply.prepared.shape.streamer()
    started, final = False, None
    try:
        async for _, out in reply.prepared.generation.events():
            if not started:
                started = True
                yield sse_event({"type": "message_start", "message": reply.start(out)})
            sent = blocks.feed(stream.feed(out.outputs[0].delta_text))
            if out.finished:
                sent += blocks.feed(stream.finish()) + blocks.finish()
                final = out
            for event in sent:
                yield sse_event(event)
        if final is None:
            raise APIError(500, "the engine ended the reply without its last output")
        stop = reply.stop(final, blocks)
    except APIError as exc:
        yield sse_event(exc.anthropic_body())
        return
    yield sse_event({"type": "message_delta",
                     "delta": {"stop_reason": stop.reason, "stop_sequence": stop.sequence},
                     "usage": _usage(final)})
    yield sse_event({"type": "message_stop"})
