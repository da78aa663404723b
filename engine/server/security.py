"""ASGI middleware guarding the API: the key on /v1 routes, and limits on request bodies."""

from __future__ import annotations

import hashlib
import hmac
import re

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from engine.server.errors import APIError

DEFAULT_MAX_BODY_BYTES = 8 << 20
# Parsing and validating JSON costs ~4 us and ~650 bytes per array or object: 8 MiB of `[1],`
# would block the server's loop for seconds and take about a gigabyte. A chat of thousands of
# messages, or a batch of 128 prompts, holds far fewer.
DEFAULT_MAX_JSON_CONTAINERS = 1 << 16
_JSON_STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"')
# What a key guards: everything that runs the model. /health and /metrics stay open (probes).
GUARDED_PATHS = ("/v1", "/tokenize")


def key_digest(api_key: str) -> str:
    """What a server needs to check a key without keeping it (the app stores only this)."""
    return hashlib.sha256(api_key.encode()).hexdigest()


class APIKeyMiddleware:
    """Requests to /v1 and /tokenize must carry `Authorization: Bearer <key>`. The key's SHA-256 is compared
    in constant time with the one the server was given."""

    def __init__(self, app: ASGIApp, key_sha256: str) -> None:
        self.app = app
        self._digest = key_sha256.encode()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["path"].startswith(GUARDED_PATHS) \
                and scope["method"] != "OPTIONS" and not self._authorized(scope):
            error = APIError(401, "a valid API key is required: send 'Authorization: Bearer "
                                  "<key>' (the key the server was started with)",
                             code="invalid_api_key")
            await error.response()(scope, receive, send)
            return
        await self.app(scope, receive, send)

    def _authorized(self, scope: Scope) -> bool:
        header = dict(scope["headers"]).get(b"authorization", b"")
        scheme, _, token = header.partition(b" ")
        given = hashlib.sha256(token.strip()).hexdigest().encode()
        return scheme.lower() == b"bearer" and hmac.compare_digest(given, self._digest)


def json_containers(body: bytes) -> int:
    """How many arrays and objects a JSON body holds (brackets inside its strings not counted)."""
    return _brackets(_JSON_STRING.sub(b"", body))


def _brackets(body: bytes) -> int:
    return body.count(b"[") + body.count(b"{")


class BodyLimitMiddleware:
    """Refuses bodies over `max_bytes` with 413: by their Content-Length, or by reading them
    whole (a chunked upload) before the route sees them; and bodies of more than
    `max_containers` JSON arrays and objects, before they are parsed."""

    def __init__(self, app: ASGIApp, max_bytes: int = DEFAULT_MAX_BODY_BYTES,
                 max_containers: int = DEFAULT_MAX_JSON_CONTAINERS) -> None:
        self.app = app
        self.max_bytes = max_bytes
        self.max_containers = max_containers

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] not in ("POST", "PUT", "PATCH"):
            await self.app(scope, receive, send)
            return
        length = dict(scope["headers"]).get(b"content-length")
        if length is not None and length.isdigit() and int(length) > self.max_bytes:
            await self._refuse(scope, receive, send)
            return
        body = await self._read(receive)
        if body is None:
            await self._refuse(scope, receive, send)
            return
        # Counting brackets is cheap; only a body with many looks past those in its strings.
        if _brackets(body) > self.max_containers and json_containers(body) > self.max_containers:
            error = APIError(413, f"the request body holds more than {self.max_containers} JSON "
                                  "arrays and objects, the server's limit: send fewer prompts or "
                                  "messages per request", code="request_too_large")
            await error.response()(scope, receive, send)
            return
        replayed = False

        async def replay() -> Message:
            nonlocal replayed
            if replayed:
                return await receive()  # after the body: waits for the client to disconnect
            replayed = True
            return {"type": "http.request", "body": body, "more_body": False}

        await self.app(scope, replay, send)

    async def _read(self, receive: Receive) -> bytes | None:
        """The whole body, or None once it passes the limit."""
        chunks, size = [], 0
        while True:
            message = await receive()
            if message["type"] != "http.request":
                return b"".join(chunks)
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.max_bytes:
                return None
            chunks.append(chunk)
            if not message.get("more_body", False):
                return b"".join(chunks)

    async def _refuse(self, scope: Scope, receive: Receive, send: Send) -> None:
        error = APIError(413, f"the request body is larger than the server's limit of "
                              f"{self.max_bytes} bytes", code="request_too_large")
        await error.response()(scope, receive, send)
