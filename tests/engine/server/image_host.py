"""A real HTTP server on 127.0.0.1 that serves images well and badly, for the server's fetch of
an image part's http(s) URL (pagoda/engine/server/remote_images.py)."""

from __future__ import annotations

import datetime
import gzip
import http.server
import ssl
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path


@dataclass
class Route:
    status: int = 200
    body: bytes = b""
    headers: dict[str, str] = field(default_factory=dict)
    delay: float = 0.0  # seconds before the status line
    trickle: float = 0.0  # seconds between the body's bytes
    chunked: bool = False  # sent without a Content-Length
    repeat: int = 1  # the body sent this many times (a long body made of a short one)


def routes(png: bytes, jpeg: bytes) -> dict[str, Route]:
    """The paths the host answers, each a way an image URL goes right or wrong."""
    return {
        "/cat.png": Route(body=png, headers={"Content-Type": "image/png"}),
        "/cat.jpg": Route(body=jpeg, headers={"Content-Type": "image/jpeg; charset=binary"}),
        "/huge.png": Route(body=png, headers={"Content-Type": "image/png"}, repeat=4000),
        "/endless.png": Route(body=png, headers={"Content-Type": "image/png"}, chunked=True,
                              repeat=100_000),
        "/page.html": Route(body=b"<html>a cat</html>", headers={"Content-Type": "text/html"}),
        "/untyped": Route(body=png),
        "/mislabeled.png": Route(body=jpeg, headers={"Content-Type": "image/png"}),
        "/zipped.png": Route(body=gzip.compress(png),
                             headers={"Content-Type": "image/png", "Content-Encoding": "gzip"}),
        "/missing.png": Route(status=404, body=b"not here"),
        "/slow.png": Route(body=png, headers={"Content-Type": "image/png"}, delay=5.0),
        "/trickle.png": Route(body=png, headers={"Content-Type": "image/png"}, trickle=0.05),
        "/moved.png": Route(status=302, headers={"Location": "/cat.png"}),
        "/to-file": Route(status=302, headers={"Location": "file:///etc/passwd"}),
        "/loop": Route(status=301, headers={"Location": "/loop"}),
    }


class _Handler(http.server.BaseHTTPRequestHandler):
    server: _ImageServer

    def do_GET(self) -> None:  # noqa: N802 (http.server's name)
        self.server.requests.append((self.path, dict(self.headers)))
        route = self.server.routes.get(self.path, Route(status=404))
        time.sleep(route.delay)
        self.send_response(route.status)
        for name, value in route.headers.items():
            self.send_header(name, value)
        if route.chunked:
            self.send_header("Transfer-Encoding", "chunked")
        else:
            self.send_header("Content-Length", str(len(route.body) * route.repeat))
        self.end_headers()
        try:
            for _ in range(route.repeat):
                self._send(route.body, route)
                self.server.sent[self.path] = self.server.sent.get(self.path, 0) + len(route.body)
            if route.chunked:
                self.wfile.write(b"0\r\n\r\n")
        except (BrokenPipeError, ConnectionResetError):
            pass  # the fetch stopped reading: what a bounded reader does

    def _send(self, body: bytes, route: Route) -> None:
        if route.chunked:
            self.wfile.write(f"{len(body):x}\r\n".encode() + body + b"\r\n")
        elif route.trickle:
            for byte in body:
                self.wfile.write(bytes([byte]))
                self.wfile.flush()
                time.sleep(route.trickle)
        else:
            self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002
        pass


class _ImageServer(http.server.ThreadingHTTPServer):
    daemon_threads = True  # a slow route's thread does not hold up the test's end

    def __init__(self, routes: dict[str, Route], tls: ssl.SSLContext | None) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        if tls is not None:
            self.socket = tls.wrap_socket(self.socket, server_side=True)
        self.tls = tls
        self.routes = routes
        self.requests: list[tuple[str, dict[str, str]]] = []
        self.sent: dict[str, int] = {}  # the body's bytes written, by path

    @property
    def url(self) -> str:
        """Its address: https://localhost:PORT under TLS (the name its certificate holds)."""
        port = self.server_address[1]
        return f"https://localhost:{port}" if self.tls else f"http://127.0.0.1:{port}"


@contextmanager
def image_host(png: bytes, jpeg: bytes,
               tls: ssl.SSLContext | None = None) -> Iterator[_ImageServer]:
    """The host, serving on an ephemeral port of 127.0.0.1 (under TLS where `tls` is given)
    until the block ends."""
    server = _ImageServer(routes(png, jpeg), tls)
    thread = threading.Thread(target=server.serve_forever, name="image-host", daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()


def localhost_certificate(folder: Path) -> tuple[Path, Path]:
    """A self-signed certificate for the name localhost, and its key, written to `folder`."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "localhost")])
    now = datetime.datetime.now(datetime.UTC)
    certificate = (
        x509.CertificateBuilder().subject_name(name).issuer_name(name)
        .public_key(key.public_key()).serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(hours=1))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.SubjectAlternativeName([x509.DNSName("localhost")]), critical=False)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256()))
    cert_path, key_path = folder / "localhost.pem", folder / "localhost.key"
    cert_path.write_bytes(certificate.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(key.private_bytes(serialization.Encoding.PEM,
                                           serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    return cert_path, key_path
