"""One OpenAI-compatible server: its API address, key and timeouts, and the requests to it.

A connection gets `connect_timeout`; a request then waits `response_timeout` for the answer to
begin. A stream that has begun has no timeout: a long reply may pause, and the user can Stop.
Each request opens its own client, so a backend can serve any event loop (the app's, a test's);
they share one TLS context, built once (see tls_context).
"""

from __future__ import annotations

import asyncio
import functools
import json
import ssl
from collections.abc import AsyncIterator

import httpx

from pagoda.app.backends.errors import (
    BackendError,
    BackendUnreachableError,
    InvalidAddressError,
    MalformedStreamError,
)
from pagoda.app.backends.remote.http_errors import error_for_status, error_for_transport
from pagoda.app.backends.remote.sse import sse_data

CONNECT_TIMEOUT_S = 10.0
# Pagoda's server begins its answer with the first token, after the whole prompt is read: long.
RESPONSE_TIMEOUT_S = 300.0
# How long a quick look at a server (is it there?) waits, where a person waits for the answer.
PROBE_TIMEOUT_S = 2.0


@functools.cache
def tls_context() -> ssl.SSLContext:
    """The system's trusted certificates, loaded once per process: loading them takes 15-30 ms,
    which every new client would otherwise spend on the caller's loop (the app's window). The
    app calls this on a worker thread when it starts with saved servers."""
    return httpx.create_ssl_context()


def api_base(address: str) -> str:
    """The API's base URL: "host:8000" and "http://host:8000" mean http://host:8000/v1; an
    address with a path ("https://host/api/v1") is kept as given."""
    text = address.strip()
    if "://" not in text:
        text = f"http://{text}"
    try:
        url = httpx.URL(text)
    except httpx.InvalidURL as exc:
        raise InvalidAddressError(f"{address!r} is not a server address ({exc}): write it like "
                                  "http://host:8000/v1") from None
    if (url.scheme not in ("http", "https") or not url.host or any(c.isspace() for c in text)
            or not 0 < (url.port or 80) < 65536):
        raise InvalidAddressError(f"{address!r} is not a server address: write it like "
                                  "http://host:8000/v1 (http or https)")
    path = url.path.rstrip("/") or "/v1"
    return str(url.copy_with(path=path, query=None, fragment=None))


class Endpoint:
    """`unreachable`: why the last request could not connect (the server down, a wrong
    address), in words; None once a request is answered, and before any was made."""

    def __init__(self, address: str, api_key: str | None = None, *,
                 connect_timeout: float = CONNECT_TIMEOUT_S,
                 response_timeout: float = RESPONSE_TIMEOUT_S) -> None:
        self.url = api_base(address)
        self.connect_timeout = connect_timeout
        self.response_timeout = response_timeout
        self._headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.unreachable: str | None = None

    def root_url(self, path: str) -> str | None:
        """`path` at the server's root, beside /v1 (where vLLM serves /tokenize); None when
        the API is not at /v1."""
        base = httpx.URL(self.url)
        if not base.path.endswith("/v1"):
            return None
        return str(base.copy_with(path=base.path.removesuffix("/v1") + path))

    async def get_json(self, path: str) -> object:
        return await self._request_json("GET", path)

    async def post_json(self, url: str, body: dict, *, max_bytes: int | None = None) -> object:
        """POST `body` and read the JSON answer; one longer than `max_bytes` is refused."""
        return await self._request_json("POST", url, body, max_bytes=max_bytes)

    async def probe(self, timeout_s: float = PROBE_TIMEOUT_S) -> str | None:
        """Ask for the server's models, briefly, and keep the answer in `unreachable`: why it
        cannot be reached, or None when it answered (whatever it said)."""
        try:
            async with asyncio.timeout(timeout_s):
                await self.get_json("/models")
        except TimeoutError:
            self.unreachable = f"{self.url} did not answer within {timeout_s:g} s"
        except BackendError:
            pass  # unreachable was set (a failed connection) or cleared (any answer)
        return self.unreachable

    async def stream_events(self, path: str, body: dict) -> AsyncIterator[str]:
        """POST `body` and yield the data of each server-sent event of the answer."""
        answered = False
        try:
            async with self._client(read_timeout=None) as client:
                response = await self._send(client, client.build_request("POST", path, json=body))
                try:
                    await self._check_status(response)
                    answered = True
                    async for data in sse_data(response.aiter_lines()):
                        yield data
                finally:
                    await response.aclose()
        except (httpx.TransportError, TimeoutError) as exc:
            raise self._transport_error(exc, answered) from exc

    async def _request_json(self, method: str, path: str, body: dict | None = None, *,
                            max_bytes: int | None = None) -> object:
        try:
            async with self._client(read_timeout=self.response_timeout) as client:
                request = client.build_request(method, path, json=body)
                response = await self._send(client, request)
                await self._check_status(response)
                content = await _read_at_most(response, max_bytes, self.url)
        except (httpx.TransportError, TimeoutError) as exc:
            raise self._transport_error(exc, answered=False) from exc
        try:
            return json.loads(content)
        except ValueError:
            raise MalformedStreamError(
                f"{self.url} answered {method} {response.url.path} with something that is not "
                "JSON. Is the address that of an OpenAI-compatible API?") from None

    def _client(self, read_timeout: float | None) -> httpx.AsyncClient:
        timeout = httpx.Timeout(self.connect_timeout, read=read_timeout,
                                write=self.connect_timeout, pool=None)
        return httpx.AsyncClient(base_url=self.url, headers=self._headers, timeout=timeout,
                                 verify=tls_context())

    async def _send(self, client: httpx.AsyncClient, request: httpx.Request) -> httpx.Response:
        """Send and wait for the answer's headers, for `response_timeout` at most."""
        async with asyncio.timeout(self.response_timeout):
            response = await client.send(request, stream=True)
        self.unreachable = None  # it answered, whatever it said
        return response

    async def _check_status(self, response: httpx.Response) -> None:
        if response.status_code != 200:
            raise error_for_status(response.status_code, await response.aread(), self.url)

    def _transport_error(self, exc: Exception, answered: bool) -> BackendError:
        error = error_for_transport(exc, self.url, connect_timeout=self.connect_timeout,
                                    response_timeout=self.response_timeout, answered=answered)
        if isinstance(error, BackendUnreachableError):
            self.unreachable = str(error)
        return error



async def _read_at_most(response: httpx.Response, max_bytes: int | None, url: str) -> bytes:
    """The answer's body, refused past `max_bytes` (None: no bound) before more is read."""
    if max_bytes is None:
        return await response.aread()
    body = bytearray()
    async for piece in response.aiter_bytes():
        body += piece
        if len(body) > max_bytes:
            await response.aclose()
            raise MalformedStreamError(
                f"{url} answered {response.url.path} with more than {max_bytes / 2**20:g} MiB: "
                "more than an answer to this request holds")
    return bytes(body)
