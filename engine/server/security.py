"""ASGI middleware guarding the API: the key on /v1 routes, and a limit on request bodies."""

from __future__ import annotations

import hashlib
import hmac

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from engine.server.errors import APIError

DEFAULT_MAX_BODY_BYTES = 8 << 20
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


class BodyLimitMiddleware:
    """Refuses bodies over `max_bytes` with 413: by their Content-Length, or by reading them
    whole (a chunked upload) before the route sees them."""

    def __init__(self, app: ASGIApp, max_bytes: int = DEFAULT_MAX_BODY_BYTES) -> None:
        self.app = app
        self.max_bytes = max_bytes

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
