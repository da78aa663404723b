"""Reading a Responses API stream (POST /v1/responses) into ReplyChunks.

Its typed events are read as the chat deltas they stand for, so one ReplyParts (and one
ReplyReader's timings and final chunk) serves both APIs: output text is content, reasoning
text is reasoning, a function_call item and its argument deltas are a tool call's pieces. The
stream ends with response.completed (or .incomplete: max_output_tokens is "length"), whose
response carries the usage; response.failed and error events are the server's failure."""

from __future__ import annotations

from pagoda.app.backends.chat.reply_parts import MalformedDeltaError
from pagoda.app.backends.errors import ServerError
from pagoda.app.backends.remote.openai_stream import ReplyReader, Usage, count
from pagoda.app.backends.types import ReplyChunk

_REASONING_DELTAS = ("response.reasoning_text.delta", "response.reasoning_summary_text.delta")
_ENDS = ("response.completed", "response.incomplete")


class ResponsesReader(ReplyReader):
    def read(self, data: str) -> ReplyChunk | None:
        self.num_events += 1
        payload = self._parse(data)
        kind = payload.get("type")
        if kind in ("error", "response.failed"):
            raise self._failed(payload)
        if kind in _ENDS:
            self._ended(payload.get("response"), kind)
            return None
        delta = _chat_delta(kind, payload)
        if delta is None:
            return None
        try:
            step = self.parts.add(delta)
        except MalformedDeltaError as exc:
            raise self._malformed(str(exc)) from None
        if step is None:
            return None
        self._arrived()
        return self.parts.chunk(step)

    def _ended(self, response: object, kind: str) -> None:
        self.done = True
        if not isinstance(response, dict):
            raise self._malformed(f"a {kind} event without its response")
        details = response.get("incomplete_details") or {}
        if kind == "response.incomplete" and details.get("reason") == "max_output_tokens":
            self.finish_reason = "length"
        usage = response.get("usage")
        if isinstance(usage, dict):
            cached = usage.get("input_tokens_details")
            self.usage = Usage(count(usage.get("input_tokens")), count(usage.get("output_tokens")),
                               count(cached.get("cached_tokens")) if isinstance(cached, dict)
                               else None)

    def _failed(self, payload: dict) -> ServerError:
        error = payload.get("error")
        if error is None and isinstance(payload.get("response"), dict):
            error = payload["response"].get("error")
        message = (error or {}).get("message") if isinstance(error, dict) else None
        message = message or payload.get("message") or "no reason given"
        return ServerError(f"{self.url} failed in the middle of the reply: {message}. What "
                           "arrived is kept; regenerate to try again.", partial_text=self.text)


def _chat_delta(kind: object, payload: dict) -> dict | None:
    """The chat delta an event stands for; None for events that add nothing to the reply
    (created, in_progress, content_part.added, *.done, ...)."""
    if kind == "response.output_text.delta":
        return {"content": payload.get("delta")}
    if kind in _REASONING_DELTAS:
        return {"reasoning_content": payload.get("delta")}
    if kind == "response.output_item.added":
        item = payload.get("item")
        if isinstance(item, dict) and item.get("type") == "function_call":
            return {"tool_calls": [{"index": payload.get("output_index"),
                                    "id": item.get("call_id"), "type": "function",
                                    "function": {"name": item.get("name"), "arguments": ""}}]}
        return None
    if kind == "response.function_call_arguments.delta":
        return {"tool_calls": [{"index": payload.get("output_index"),
                                "function": {"arguments": payload.get("delta")}}]}
    return None
