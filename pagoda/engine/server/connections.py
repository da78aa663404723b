"""Bounds on the connections a server holds, which uvicorn leaves open: a client must send its
request's headers in time, and only so many connections may be open at once.

uvicorn times out only a connection idle after a response (`timeout_keep_alive`); one that never
finishes its headers (slowloris) is held forever, and its `limit_concurrency` answers 503 only
once headers are complete, which such a client never sends.
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass
from functools import partial
from typing import Any

from uvicorn.protocols.http.auto import AutoHTTPProtocol

from pagoda.engine.server.errors import APIError

try:
    import resource
except ImportError:  # Windows: no such limit to keep under
    resource = None

DEFAULT_HEADER_TIMEOUT = 10.0
DEFAULT_MAX_CONNECTIONS = 1000
# File descriptors kept for everything else (model files, the listening socket, logs).
_SPARE_FILES = 64
# How long a refused connection may still send its request (read and dropped) before it is closed.
_REFUSED_LINGER_SECONDS = 1.0


@dataclass(frozen=True, slots=True)
class ConnectionLimits:
    """`header_timeout`: seconds a client has to send a request's headers, from connecting or
    from its first byte after a response; `max_connections`: connections open at once. A
    connection past the most closes one idle after its reply or else the one that has waited
    longest for its headers, or, when all have requests running, is answered 503 and closed."""

    header_timeout: float = DEFAULT_HEADER_TIMEOUT
    max_connections: int = DEFAULT_MAX_CONNECTIONS

    def __post_init__(self) -> None:
        if not self.header_timeout > 0:
            raise ValueError(f"header_timeout={self.header_timeout} must be > 0 seconds")
        if self.max_connections < 1:
            raise ValueError(f"max_connections={self.max_connections} must be at least 1")

    def protocol(self) -> partial:
        """What uvicorn's Config takes as `http`: builds the guarded protocol per connection."""
        return partial(GuardedHTTPProtocol, limits=self, cap=_within_open_files(
            self.max_connections))


def _within_open_files(max_connections: int) -> int:
    """The cap, lowered to what the process may open: past it, accepting fails (EMFILE) and
    asyncio logs the failure on every try, which the cap is there to prevent."""
    if resource is None:
        return max_connections
    soft, _hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        return max_connections
    return max(1, min(max_connections, soft - _SPARE_FILES))


def _plain_response(status: bytes, error: APIError) -> bytes:
    body = json.dumps(error.body()).encode()
    return (b"HTTP/1.1 " + status + b"\r\ncontent-type: application/json\r\n"
            b"content-length: " + str(len(body)).encode() + b"\r\nconnection: close\r\n\r\n"
            + body)


class GuardedHTTPProtocol(AutoHTTPProtocol):
    """uvicorn's HTTP protocol (httptools, else h11) with the header timeout and the cap."""

    def __init__(self, *args: Any, limits: ConnectionLimits, cap: int, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._limits = limits
        self._cap = cap
        self._header_timer: asyncio.TimerHandle | None = None
        self._refused = False

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        if len(self.connections) >= self._cap and not self._evict_slowest():
            self._refuse(transport)
            return
        super().connection_made(transport)
        self._arm_header_timer()

    def _evict_slowest(self) -> bool:
        """Make room by closing a connection idle after its reply, else the one that has waited
        longest for its headers, so a crowd of slow clients cannot keep a prompt one out; False
        when every connection open has a request running."""
        waiting = [connection for connection in self.connections
                   if isinstance(connection, GuardedHTTPProtocol) and connection._runs_nothing()]
        if not waiting:
            return False
        slowest = min(waiting, key=lambda connection: connection._waiting_key())
        slowest._close_with(b"503 Service Unavailable", APIError(
            503, "the server has its most connections open and closed this one, which had not "
                 "sent its request: send it at once", code="too_many_connections"))
        return True

    def _runs_nothing(self) -> bool:
        """Waiting for its headers, or idle after a reply (kept alive, not yet sent more)."""
        return self._header_timer is not None or (
            self.cycle is not None and self.cycle.response_complete)

    def _waiting_key(self) -> float:
        # An idle connection's next bytes may not even have been read yet: it goes first.
        return self._header_timer.when() if self._header_timer is not None else float("-inf")

    def _refuse(self, transport: asyncio.Transport) -> None:
        """Answer 503 before reading anything. Only our side is closed at first: closing both
        at once would reset the connection when the request arrives, and the client would
        read a reset instead of the 503."""
        self._refused = True
        transport.write(_plain_response(b"503 Service Unavailable", APIError(
            503, f"the server has its most connections open ({self._cap}): retry in a moment "
                 "(its --max-connections sets the most)", code="too_many_connections")))
        if transport.can_write_eof():
            transport.write_eof()
        self.loop.call_later(_REFUSED_LINGER_SECONDS, transport.close)

    def data_received(self, data: bytes) -> None:
        if self._refused:
            return  # the request of a refused connection: already answered
        between_requests = self.cycle is None or self.cycle.response_complete
        if between_requests and self._header_timer is None:
            self._arm_header_timer()  # a new request begins: its headers are timed
        cycle = self.cycle
        super().data_received(data)
        if self.cycle is not cycle:  # uvicorn starts a request once its headers are complete
            self._disarm_header_timer()

    def connection_lost(self, exc: Exception | None) -> None:
        if self._refused:
            return  # uvicorn never saw it
        self._disarm_header_timer()
        super().connection_lost(exc)

    def _arm_header_timer(self) -> None:
        self._header_timer = self.loop.call_later(self._limits.header_timeout,
                                                  self._headers_too_late)

    def _disarm_header_timer(self) -> None:
        if self._header_timer is not None:
            self._header_timer.cancel()
            self._header_timer = None

    def _headers_too_late(self) -> None:
        self._close_with(b"408 Request Timeout", APIError(
            408, f"the request's headers did not arrive within {self._limits.header_timeout:g} "
                 "s of the connection (or of its last reply): send them at once",
            code="header_timeout"))

    def _close_with(self, status: bytes, error: APIError) -> None:
        self._disarm_header_timer()
        if not self.transport.is_closing():
            self.transport.write(_plain_response(status, error))
            self.transport.close()
