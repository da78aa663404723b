"""An ASGI wrapper that records every request a client sends to the server and how it was answered:
what bench/coding_agents.py reports, so a request the server refused (a 400, 404, 422, 500) is
seen with the body that caused it."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from pathlib import Path

# Of an error's answer, this much is kept: enough for the server's message.
ERROR_BODY_CHARS = 2000


@dataclass(slots=True)
class Exchange:
    """One request and its answer."""

    method: str
    path: str
    started: float
    request_bytes: bytes = b""
    content_encoding: str = ""
    status: int = 0
    seconds: float = 0.0
    error_body: str = ""

    def tool_results(self) -> int:
        """How many tool results the request carries back to the model: the Responses API's
        function_call_output items (Codex), the Messages API's tool_result blocks (Claude
        Code), chat completions' tool messages. Compressed or unreadable bodies count none."""
        body = _json_body(self.request_bytes, self.content_encoding)
        if not isinstance(body, dict):
            return 0
        items = body.get("input") if isinstance(body.get("input"), list) else []
        found = sum(1 for item in items
                    if isinstance(item, dict) and item.get("type") == "function_call_output")
        for message in body.get("messages") or []:
            if not isinstance(message, dict):
                continue
            content = message.get("content")
            blocks = content if isinstance(content, list) else []
            found += sum(1 for b in blocks if isinstance(b, dict) and b.get("type") == "tool_result")
            found += message.get("role") == "tool"
        return found

    def summary(self) -> str:
        """A line: status, route, seconds, and what the body asked for."""
        return (f"{self.status} {self.method} {self.path} {self.seconds:.1f}s "
                f"{describe_body(self.request_bytes, self.content_encoding)}")


def _json_body(raw: bytes, encoding: str) -> object:
    if encoding or not raw:
        return None
    try:
        return json.loads(raw)
    except ValueError:
        return None


def describe_body(raw: bytes, encoding: str) -> str:
    """The request's top-level fields, its tools and its size: what says which features it used."""
    if encoding:
        return f"({len(raw):,} bytes, Content-Encoding {encoding})"
    if not raw:
        return ""
    try:
        body = json.loads(raw)
    except ValueError:
        return f"({len(raw):,} bytes, not JSON)"
    if not isinstance(body, dict):
        return f"({len(raw):,} bytes)"
    tools = [t.get("name") or t.get("type") or (t.get("function") or {}).get("name")
             for t in body.get("tools") or [] if isinstance(t, dict)]
    fields = ",".join(sorted(body))
    return f"({len(raw):,} bytes) fields={fields} tools={len(tools)}:{','.join(map(str, tools))}"


@dataclass(slots=True)
class RequestLog:
    """Wraps an ASGI app; `exchanges` fills as requests end, and each request's body is written
    to `folder` (NNN.json) where one is given."""

    app: object
    folder: Path | None = None
    exchanges: list[Exchange] = field(default_factory=list)

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = dict(scope.get("headers") or [])
        exchange = Exchange(scope["method"], scope["path"], time.perf_counter(),
                            content_encoding=headers.get(b"content-encoding", b"").decode())
        chunks: list[bytes] = []
        error: list[bytes] = []

        async def logged_receive():
            message = await receive()
            if message["type"] == "http.request":
                chunks.append(message.get("body", b""))
            return message

        async def logged_send(message):
            if message["type"] == "http.response.start":
                exchange.status = message["status"]
            elif message["type"] == "http.response.body" and exchange.status >= 400:
                error.append(message.get("body", b""))
            await send(message)

        try:
            await self.app(scope, logged_receive, logged_send)
        finally:
            exchange.request_bytes = b"".join(chunks)
            exchange.seconds = time.perf_counter() - exchange.started
            exchange.error_body = b"".join(error).decode(errors="replace")[:ERROR_BODY_CHARS]
            self._keep(exchange)

    def _keep(self, exchange: Exchange) -> None:
        self.exchanges.append(exchange)
        if self.folder is not None and exchange.request_bytes:
            name = f"{len(self.exchanges):03d}{exchange.path.replace('/', '_')}.json"
            (self.folder / name).write_bytes(exchange.request_bytes)

    def refused(self) -> list[Exchange]:
        return [e for e in self.exchanges if e.status >= 400]

    def tool_results(self) -> int:
        """The most tool results any one request carried back (each request holds the whole
        conversation so far): 0 where no call's result ever reached the model."""
        return max((e.tool_results() for e in self.exchanges), default=0)
