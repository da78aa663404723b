"""OpenAIBackend: replies from any OpenAI-compatible server (vLLM, SGLang, llama.cpp's server,
Ollama, another Pagoda), streamed over HTTP."""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import AsyncIterator, Sequence
from typing import Literal

from pagoda.app.backends.chat.estimate import estimate_tokens
from pagoda.app.backends.chat.meter import ThroughputMeter
from pagoda.app.backends.chat.starting import StartingReplies
from pagoda.app.backends.chat.tool_options import tool_use
from pagoda.app.backends.errors import (
    BackendError,
    BackendStoppedError,
    InvalidRequestError,
    ModelNotFoundError,
)
from pagoda.app.backends.remote.endpoint import CONNECT_TIMEOUT_S, RESPONSE_TIMEOUT_S, Endpoint
from pagoda.app.backends.remote.openai_request import (
    CONTINUING_FLAVORS,
    FLAVORS,
    Flavor,
    chat_request,
)
from pagoda.app.backends.remote.openai_stream import ReplyReader
from pagoda.app.backends.remote.responses_request import responses_request
from pagoda.app.backends.remote.responses_stream import ResponsesReader
from pagoda.app.backends.remote.server_info import fetch_server_info, tokenize_chat
from pagoda.app.backends.types import (
    BackendStats,
    ChatMessage,
    ImageInput,
    ReplyChunk,
    SamplingOptions,
    TokenCount,
    ToolSpec,
)

# The context length assumed when the server does not report one (Ollama, older llama.cpp
# builds): small enough that most models hold it.
DEFAULT_MAX_MODEL_LEN = 4096
_ABORT = object()
_END = object()


# The API a chat is sent to: chat completions, or the Responses API of a server that offers
# only that (POST /chat/completions a 404 where POST /responses is not).
Api = Literal["chat", "responses"]
APIS: tuple[Api, ...] = ("chat", "responses")

# Servers with vLLM's POST /tokenize, which counts a chat in the model's own template.
_COUNTING_FLAVORS = ("vllm", "pagoda")

class _Reply:
    """One streaming reply. A task of its own reads the server's events into a queue, so an
    abort (from any thread) can stop the reading at once: cancelling it closes the connection,
    and the server then aborts the request."""

    def __init__(self, events: AsyncIterator[str]) -> None:
        self.loop = asyncio.get_running_loop()
        self.queue: asyncio.Queue = asyncio.Queue()
        self.aborted = False
        self._task = asyncio.create_task(self._pump(events))

    async def _pump(self, events: AsyncIterator[str]) -> None:
        try:
            async for data in events:
                self.queue.put_nowait(data)
        except Exception as exc:  # noqa: BLE001 - handed to the reader of the stream
            self.queue.put_nowait(exc)
        finally:
            self.queue.put_nowait(_END)

    def abort(self) -> None:
        """Only on the reply's loop; see abort_soon."""
        if not self.aborted:
            self.aborted = True
            self._task.cancel()
            self.queue.put_nowait(_ABORT)

    def abort_soon(self) -> None:
        try:
            self.loop.call_soon_threadsafe(self.abort)
        except RuntimeError:  # the loop is closed: nobody reads this reply any more
            pass

    def close(self) -> None:
        self._task.cancel()


class OpenAIBackend:
    """A ChatBackend over an OpenAI-compatible server at `base_url` ("http://host:8000/v1").

    model: the served model to use; None takes the first the server lists. flavor: the kind of
    server ("vllm", "sglang", "pagoda", "llama.cpp", "openai"), which decides the sampling
    fields sent beyond OpenAI's; None detects it from GET /models. max_model_len: the context
    length, when the server does not report it (else DEFAULT_MAX_MODEL_LEN, marked a guess).
    api: "chat" (POST /chat/completions) or "responses" (POST /responses); None sends chats to
    chat completions and turns to the Responses API for good where the server has only that.

    `connect()` asks the server about its model; the first stream or count does it otherwise.
    """

    def __init__(self, base_url: str, model: str | None = None, api_key: str | None = None, *,
                 flavor: Flavor | None = None, max_model_len: int | None = None,
                 api: Api | None = None,
                 connect_timeout: float = CONNECT_TIMEOUT_S,
                 response_timeout: float = RESPONSE_TIMEOUT_S) -> None:
        if flavor is not None and flavor not in FLAVORS:
            raise ValueError(f"flavor={flavor!r} must be one of {FLAVORS} or None")
        if api is not None and api not in APIS:
            raise ValueError(f"api={api!r} must be one of {APIS} or None")
        self.endpoint = Endpoint(base_url, api_key, connect_timeout=connect_timeout,
                                 response_timeout=response_timeout)
        self.location = self.endpoint.url
        self.model_name = model or ""
        self.flavor: Flavor = flavor or "openai"
        self.max_model_len = max_model_len or DEFAULT_MAX_MODEL_LEN
        self.max_model_len_known = max_model_len is not None
        # A server does not say what its chat template can switch: the window offers no
        # thinking switch for it (a request may still carry one: openai_request says where).
        self.thinking_switch = False
        # A server does not say whether its model sees images either: they are sent, and a
        # refusal is said in words (http_errors).
        self.image_input = ImageInput(None)
        self._requested_model = model
        self._requested_flavor = flavor
        self.api: Api = api or "chat"
        self._api_known = api is not None
        self._connected = False
        self._stopped = False
        self._replies: dict[str, _Reply] = {}
        self._starting = StartingReplies()
        self._ids = itertools.count()
        self._meter = ThroughputMeter()
        self._last_ttft: float | None = None

    async def connect(self) -> None:
        """Learn the model's name, its context length and the kind of server (GET /models)."""
        self._check_running()
        info = await fetch_server_info(self.endpoint, self._requested_model)
        self.model_name = info.model
        self.flavor = self._requested_flavor or info.flavor
        if not self.max_model_len_known and info.max_model_len is not None:
            self.max_model_len = info.max_model_len
            self.max_model_len_known = True
        self._connected = True

    async def stream(self, messages: Sequence[ChatMessage], options: SamplingOptions,
                     request_id: str | None = None, *, continue_final_message: bool = False,
                     cache_tag: str | None = None) -> AsyncIterator[ReplyChunk]:
        # cache_tag is not sent: the server keeps its own cache, out of our reach.
        request_id = request_id or f"reply-{next(self._ids)}"
        with self._starting.starting(request_id):
            if not self._connected:
                await self.connect()
        self._check_running()
        if self._starting.was_aborted(request_id):
            yield ReplyChunk("", "", "abort")
            return
        if request_id in self._replies:
            raise InvalidRequestError(f"a reply with the id {request_id!r} is already streaming")
        tool_use(options)  # checked here as the engine in this process checks it
        reader = self._reader()
        try:
            async for chunk in self._reply(request_id, messages, options,
                                           continue_final_message, reader):
                yield chunk
        except ModelNotFoundError:
            if self._api_known or self.api != "chat" or reader.num_events:
                raise
            # No chat completions here: the Responses API, if the server has it, for good.
            self.api = "responses"
            try:
                async for chunk in self._reply(request_id, messages, options,
                                               continue_final_message, self._reader()):
                    yield chunk
            except ModelNotFoundError:
                self.api = "chat"
                raise
            self._api_known = True

    def _reader(self) -> ReplyReader:
        kind = ResponsesReader if self.api == "responses" else ReplyReader
        return kind(self.endpoint.url, time.monotonic())

    async def _reply(self, request_id: str, messages: Sequence[ChatMessage],
                     options: SamplingOptions, continue_final_message: bool,
                     reader: ReplyReader) -> AsyncIterator[ReplyChunk]:
        path, body = self._request(messages, options, continue_final_message)
        reply = _Reply(self.endpoint.stream_events(path, body))
        self._replies[request_id] = reply
        try:
            async for chunk in self._chunks(reply, reader):
                yield chunk
        finally:
            reply.close()
            self._replies.pop(request_id, None)

    def _request(self, messages: Sequence[ChatMessage], options: SamplingOptions,
                 continue_final_message: bool) -> tuple[str, dict]:
        """The path and body of the chat's request, in the API this server is sent chats in."""
        continues = CONTINUING_FLAVORS if self.api == "chat" else ()
        if continue_final_message and self.flavor not in continues:
            raise InvalidRequestError(
                f"{self.location} cannot continue a reply where it stopped (only vLLM, SGLang "
                "and Pagoda can, through chat completions): regenerate it with a larger max "
                "tokens instead.")
        if self.api == "responses":
            return "responses", responses_request(self.model_name, messages, options)
        return "chat/completions", chat_request(self.model_name, messages, options, self.flavor,
                                                continue_final_message)

    def abort(self, request_id: str) -> None:
        self._starting.abort(request_id)
        reply = self._replies.get(request_id)
        if reply is not None:
            reply.abort_soon()

    def stats(self) -> BackendStats:
        """Only what this client sees: its own replies running, their speed as they arrive and
        the last one's time to first token. The server's queue and KV cache stay unknown."""
        return BackendStats(num_running=len(self._replies), tokens_per_s=self._meter.rate(),
                            time_to_first_token=self._last_ttft)

    async def count_tokens(self, messages: Sequence[ChatMessage],
                           tools: Sequence[ToolSpec] = ()) -> TokenCount:
        """Exact from vLLM's (and Pagoda's) /tokenize; from other servers, an estimate."""
        if not self._connected:
            await self.connect()
        if self.flavor in _COUNTING_FLAVORS:
            n = await tokenize_chat(self.endpoint, self.model_name, messages, tools)
            if n is not None:
                return TokenCount(n, exact=True)
        return estimate_tokens(messages, tools)

    def shutdown(self) -> None:
        self._stopped = True
        for reply in list(self._replies.values()):
            reply.abort_soon()

    async def _chunks(self, reply: _Reply, reader: ReplyReader) -> AsyncIterator[ReplyChunk]:
        while True:
            item = await reply.queue.get()
            if item is _ABORT:
                yield reader.final("abort")
                return
            if item is _END:
                yield reader.at_end_of_stream()
                return
            if isinstance(item, BaseException):
                raise _with_partial_text(item, reader.text)
            chunk = reader.read(item)
            if chunk is not None:
                self._measure(reader)
                yield chunk
            if reader.done:
                yield reader.final()
                return

    def _measure(self, reader: ReplyReader) -> None:
        self._meter.add(1)
        if reader.num_deltas == 1:
            self._last_ttft = reader.time_to_first_token

    def _check_running(self) -> None:
        if self._stopped:
            raise BackendStoppedError(f"The connection to {self.location} was closed: connect "
                                      "again to use this server.")


def _with_partial_text(exc: BaseException, text: str) -> BaseException:
    if isinstance(exc, BackendError) and not exc.partial_text:
        exc.partial_text = text
    return exc
