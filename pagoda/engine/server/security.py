"""ASGI middleware guarding the API: the Host a request names, the key on every route but the
probes', and limits on request bodies."""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import re

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from pagoda.engine.server.errors import APIError

DEFAULT_MAX_BODY_BYTES = 8 << 20
# Parsing and validating JSON costs ~4 us and ~650 bytes per array or object: 8 MiB of `[1],`
# would block the server's loop for seconds and take about a gigabyte. A chat of thousands of
# messages, or a batch of 128 prompts, holds far fewer.
DEFAULT_MAX_JSON_CONTAINERS = 1 << 16
_JSON_STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"')
# The only routes a key does not guard: probes, which tell whether a server is up and how busy.
# Every other path, a route added later included, needs the key.
PUBLIC_PATHS = frozenset({"/health", "/metrics"})
_LOOPBACK_NAMES = {"localhost", "localhost.localdomain", "ip6-localhost"}


def key_digest(api_key: str) -> str:
    """What a server needs to check a key without keeping it (the app stores only this)."""
    return hashlib.sha256(api_key.encode()).hexdigest()


def is_loopback(host: str) -> bool:
    """Whether a host name or address (an IPv6 one in brackets or not) is this machine's
    loopback: localhost and its aliases, names under .localhost, 127.0.0.0/8, ::1."""
    name = host.lower().rstrip(".")
    if name in _LOOPBACK_NAMES or name.endswith(".localhost"):
        return True
    try:
        return ipaddress.ip_address(name.strip("[]")).is_loopback
    except ValueError:
        return False


def host_name(header: bytes) -> str:
    """The name of a Host header without its port: `[::1]:8000` -> `[::1]`."""
    text = header.decode("latin-1").strip()
    if text.startswith("["):
        return text[:text.find("]") + 1] if "]" in text else text
    return text.rpartition(":")[0] if ":" in text else text


class HostCheckMiddleware:
    """A server that listens on loopback answers only requests addressed to a loopback name
    (or one of `allowed`). A web page can point a name of its own at 127.0.0.1 (DNS
    rebinding) and so reach a server without a key from the browser; its requests still
    name that page's host, and are refused with 403."""

    def __init__(self, app: ASGIApp, allowed: tuple[str, ...] = ()) -> None:
        self.app = app
        self._allowed = {name.lower().rstrip(".") for name in allowed}

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or self._allows(scope):
            await self.app(scope, receive, send)
            return
        name = host_name(dict(scope["headers"])[b"host"])
        error = APIError(403, f"this server listens on this machine only and answers requests "
                              f"addressed to localhost, 127.0.0.1 or [::1], not to {name!r}: a web "
                              f"page can point a name of its own at this machine. To serve that "
                              f"name, start the server with --allowed-hosts {name or 'NAME'}",
                         code="host_not_allowed")
        await error.response(scope["path"])(scope, receive, send)

    def _allows(self, scope: Scope) -> bool:
        header = dict(scope["headers"]).get(b"host")
        if header is None:
            return True  # an HTTP/1.0 client: a browser always names the host
        name = host_name(header)
        return is_loopback(name) or name.lower().rstrip(".") in self._allowed


class APIKeyMiddleware:
    """Requests to every path but PUBLIC_PATHS must carry `Authorization: Bearer <key>`, or
    `x-api-key: <key>` as Anthropic's clients send it. The key's SHA-256 is compared in
    constant time with the one the server was given."""

    def __init__(self, app: ASGIApp, key_sha256: str) -> None:
        self.app = app
        self._digest = key_sha256.encode()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["path"] not in PUBLIC_PATHS \
                and scope["method"] != "OPTIONS" and not self._authorized(scope):
            error = APIError(401, "a valid API key is required: send 'Authorization: Bearer "
                                  "<key>' or 'x-api-key: <key>' (the key the server was "
                                  "started with)",
                             code="invalid_api_key")
            await error.response(scope["path"])(scope, receive, send)
            return
        await self.app(scope, receive, send)

    def _authorized(self, scope: Scope) -> bool:
        headers = dict(scope["headers"])
        scheme, _, bearer = headers.get(b"authorization", b"").partition(b" ")
        if scheme.lower() == b"bearer" and self._matches(bearer):
            return True
        key = headers.get(b"x-api-key")
        return key is not None and self._matches(key)

    def _matches(self, token: bytes) -> bool:
        given = hashlib.sha256(token.strip()).hexdigest().encode()
        return hmac.compare_digest(given, self._digest)


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
            await error.response(scope["path"])(scope, receive, send)
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
        await error.response(scope["path"])(scope, receive, send)
