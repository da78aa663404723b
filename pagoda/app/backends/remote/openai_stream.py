"""Reading a server's chat.completion.chunk events into ReplyChunks.

The shapes met in the wild: the role in a first chunk with empty content; finish_reason on the
last content chunk (vLLM) or on a chunk of its own (llama.cpp); usage in a last chunk with no
choices, after the finish; an error object in place of a chunk when generation fails midway;
`prompt_progress` on the chunks sent while a long prompt is read (llama.cpp and Pagoda, asked
with `return_progress`). Reasoning and tool calls in the deltas are read by ReplyParts.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass

from pagoda.app.backends.chat.reply_parts import MalformedDeltaError, ReplyParts, Step
from pagoda.app.backends.errors import ConnectionDroppedError, MalformedStreamError, ServerError
from pagoda.app.backends.remote.http_errors import server_message
from pagoda.app.backends.types import FinishReason, PromptProgress, ReplyChunk

DONE = "[DONE]"
# Any other reason a server gives (stop, eos, content_filter) ends the reply as "stop".
_FINISH: dict[str, FinishReason] = {"length": "length", "abort": "abort",
                                    "tool_calls": "tool_calls"}


@dataclass(slots=True)
class Usage:
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    cached_tokens: int | None = None


class ReplyReader:
    """The reply so far, built from the data of each event; `url` names the server in errors.

    Every delta that brings something (text, reasoning, a piece of a call) counts as one token
    for the speed until usage says how many there were: servers stream a token at a time.
    """

    def __init__(self, url: str, started: float) -> None:
        self.url = url
        self.started = started
        self.parts = ReplyParts()
        self.finish_reason: FinishReason | None = None
        self.done = False
        self.num_events = 0
        self.num_deltas = 0
        self.first_token_time: float | None = None
        self.last_token_time: float | None = None
        self.usage = Usage()

    def read(self, data: str) -> ReplyChunk | None:
        """The chunk for one event's data; None when it brings neither new text nor progress."""
        self.num_events += 1
        if data.strip() == DONE:
            self.done = True
            return None
        payload = self._parse(data)
        self._read_usage(payload.get("usage"))
        step = self._read_choice(payload)
        if step is not None:
            self._arrived()
            return self.parts.chunk(step)
        progress = _prompt_progress(payload.get("prompt_progress"))
        if progress is not None and self.first_token_time is None:
            return ReplyChunk("", self.text, prompt_progress=progress)
        return None

    def final(self, finish_reason: FinishReason | None = None) -> ReplyChunk:
        """The last chunk, with the counts and timings; `finish_reason` overrides the server's
        (an abort)."""
        reason = self.finish_reason or finish_reason or "stop"
        num_output = self.usage.completion_tokens
        return self.parts.chunk(
            finish_reason=reason, num_prompt_tokens=self.usage.prompt_tokens,
            num_cached_tokens=self.usage.cached_tokens, num_output_tokens=num_output,
            time_to_first_token=self.time_to_first_token,
            tokens_per_s=self._tokens_per_s(num_output or self.num_deltas))

    def at_end_of_stream(self) -> ReplyChunk:
        """The last chunk once the server closed the stream; a reply it never finished is a
        dropped connection, and a stream without a single event is no chat stream at all."""
        if self.finish_reason is not None or self.done:
            return self.final()
        if self.num_events == 0:
            raise MalformedStreamError(
                f"{self.url} answered without a stream of events. Is the address that of an "
                "OpenAI-compatible API (it usually ends in /v1)?")
        raise ConnectionDroppedError(
            f"{self.url} closed the stream before the reply was complete. What arrived is "
            "kept; check the server, then regenerate.", partial_text=self.text)

    @property
    def time_to_first_token(self) -> float | None:
        if self.first_token_time is None:
            return None
        return self.first_token_time - self.started

    @property
    def text(self) -> str:
        return self.parts.text

    def _arrived(self) -> None:
        now = time.monotonic()
        self.first_token_time = self.first_token_time or now
        self.last_token_time = now
        self.num_deltas += 1

    def _tokens_per_s(self, num_tokens: int) -> float | None:
        if self.first_token_time is None or num_tokens < 2:
            return None
        elapsed = self.last_token_time - self.first_token_time
        return (num_tokens - 1) / elapsed if elapsed > 0 else None

    def _parse(self, data: str) -> dict:
        try:
            payload = json.loads(data)
        except ValueError:
            raise self._malformed(f"a line that is not JSON: {data[:80]!r}") from None
        if not isinstance(payload, dict):
            raise self._malformed(f"a line that is not a JSON object: {data[:80]!r}")
        if payload.get("error") or payload.get("object") == "error":
            message, _ = server_message(data)
            raise ServerError(f"{self.url} failed in the middle of the reply: {message}. What "
                              "arrived is kept; regenerate to try again.", partial_text=self.text)
        return payload

    def _read_choice(self, payload: dict) -> Step | None:
        """What the first choice's delta adds (None: nothing), noting its finish reason."""
        choice = self._first_choice(payload)
        if choice is None:
            return None
        if choice.get("finish_reason"):
            self.finish_reason = _FINISH.get(choice["finish_reason"], "stop")
        try:
            return self.parts.add(choice.get("delta") or {})
        except MalformedDeltaError as exc:
            raise self._malformed(str(exc)) from None

    def _first_choice(self, payload: dict) -> dict | None:
        choices = payload.get("choices")
        if choices is None:
            return None
        if not isinstance(choices, list) or not all(isinstance(c, dict) for c in choices):
            raise self._malformed("a chunk whose choices are not a list of objects")
        return next((c for c in choices if c.get("index", 0) == 0), None)

    def _read_usage(self, usage: object) -> None:
        if not isinstance(usage, dict):
            return
        details = usage.get("prompt_tokens_details")
        self.usage = Usage(count(usage.get("prompt_tokens")),
                           count(usage.get("completion_tokens")),
                           count(details.get("cached_tokens")) if isinstance(details, dict)
                           else None)

    def _malformed(self, what: str) -> MalformedStreamError:
        return MalformedStreamError(
            f"{self.url} sent {what}. Pagoda cannot read this reply: is the server "
            "OpenAI-compatible? What arrived is kept.", partial_text=self.text)


def _prompt_progress(progress: object) -> PromptProgress | None:
    """llama.cpp's {"total", "cache", "processed", "time_ms"}: read tokens (cached ones
    included) of the prompt's total; None when it is not that."""
    if not isinstance(progress, dict):
        return None
    total, processed = count(progress.get("total")), count(progress.get("processed"))
    if total is None or processed is None or total <= 0:
        return None
    return PromptProgress(min(max(processed, 0), total), total)


def count(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None
