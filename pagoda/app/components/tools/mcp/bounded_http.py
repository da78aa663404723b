"""An MCP server's HTTP replies bounded as they stream: a JSON reply over MAX_MESSAGE_BYTES is
not read on; its caller gets, in its place, a JSON-RPC error giving the bound in words (as a
stdio server's line over it does, stdio_streams.py). Event streams are bounded event by event
by the SDK."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator

import httpx2

from pagoda.app.components.tools.mcp.stdio_streams import MAX_MESSAGE_BYTES, MiB, too_large_error

JSON_TYPE = "application/json"


class BoundedReplies(httpx2.AsyncBaseTransport):
    """httpx's own transport, each JSON reply's body held to `max_bytes`."""

    def __init__(self, max_bytes: int = MAX_MESSAGE_BYTES) -> None:
        self._inner = httpx2.AsyncHTTPTransport()
        self._max_bytes = max_bytes

    async def handle_async_request(self, request: httpx2.Request) -> httpx2.Response:
        response = await self._inner.handle_async_request(request)
        content_type = response.headers.get("content-type", "").split(";")[0].strip()
        request_id = _request_id(request)
        if content_type == JSON_TYPE and request_id is not None:
            response.stream = _BoundedBody(response.stream, self._max_bytes, request_id)
        return response

    async def aclose(self) -> None:
        await self._inner.aclose()


class _BoundedBody(httpx2.AsyncByteStream):
    """The body whole once it has ended within the bound; past it, the error for its caller."""

    def __init__(self, stream: httpx2.AsyncByteStream, max_bytes: int,
                 request_id: int | str) -> None:
        self._stream = stream
        self._max_bytes = max_bytes
        self._request_id = request_id

    async def __aiter__(self) -> AsyncIterator[bytes]:
        pieces: list[bytes] = []
        size = 0
        async for piece in self._stream:
            size += len(piece)
            if size > self._max_bytes:
                await self._stream.aclose()
                words = (f"the server's reply was more than the {self._max_bytes / MiB:g} MiB "
                         "Pagoda reads of one reply: it was not read")
                yield too_large_error(self._request_id, words).model_dump_json(
                    by_alias=True, exclude_none=True).encode()
                return
            pieces.append(piece)
        yield b"".join(pieces)

    async def aclose(self) -> None:
        await self._stream.aclose()


def _request_id(request: httpx2.Request) -> int | str | None:
    """The JSON-RPC id of a request Pagoda sent (None: a notification, or no JSON-RPC)."""
    if request.method != "POST":
        return None
    try:
        body = json.loads(request.content)
    except (ValueError, httpx2.RequestNotRead):
        return None
    request_id = body.get("id") if isinstance(body, dict) else None
    return request_id if isinstance(request_id, int | str) else None
