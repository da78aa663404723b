"""An image part's http(s) URL fetched from a real HTTP server on 127.0.0.1: the image comes
back; a body over the cap, a type that is not an image, a mislabelled or compressed body, a
404, a slow or trickling server, a redirect elsewhere than http(s) or round in circles are each
refused in words naming the part; and an address on this machine is refused unless the server
was told to fetch from private addresses."""

import asyncio
import io
import socket
import ssl
import time

import httpx
import pytest
from PIL import Image

from pagoda.engine.errors import ImageInputError
from pagoda.engine.multimodal.images import decode_image_bytes
from pagoda.engine.server import remote_images
from pagoda.engine.server.remote_images import RemoteImages, fetch_image, is_public
from tests.engine.server.image_host import image_host, localhost_certificate

WHERE = "messages[0].content[1].image_url.url"
# Tests serve from 127.0.0.1: a fetch from there is allowed only as a private host.
LOCAL = RemoteImages(allowed=True, private_hosts=True, timeout=2.0)
CAP = 50_000


def encoded(fmt: str) -> bytes:
    image = Image.new("RGB", (64, 48))
    image.putdata([(x * 4, y * 5, 128) for y in range(48) for x in range(64)])
    out = io.BytesIO()
    image.save(out, format=fmt)
    return out.getvalue()


PNG, JPEG = encoded("PNG"), encoded("JPEG")


@pytest.fixture(scope="module")
def host():
    with image_host(PNG, JPEG) as server:
        yield server


def fetch(url: str, policy: RemoteImages = LOCAL, max_bytes: int = CAP):
    return asyncio.run(fetch_image(url, WHERE, policy, max_bytes))


def refusal(url: str, policy: RemoteImages = LOCAL, max_bytes: int = CAP) -> str:
    with pytest.raises(ImageInputError) as caught:
        fetch(url, policy, max_bytes)
    message = str(caught.value)
    assert message.startswith(WHERE)
    return message


def test_a_served_png_comes_back_as_its_bytes_and_type(host):
    got = fetch(f"{host.url}/cat.png")
    assert (got.data, got.mime_type) == (PNG, "image/png")
    assert decode_image_bytes(got.data, got.mime_type, WHERE).size == (64, 48)


def test_the_request_asks_for_images_sent_as_stored(host):
    fetch(f"{host.url}/cat.jpg")
    path, headers = host.requests[-1]
    assert path == "/cat.jpg"
    assert headers["Accept-Encoding"] == "identity"
    assert headers["Host"] == host.url.removeprefix("http://")


def test_a_content_type_with_parameters_is_read_by_its_type(host):
    assert fetch(f"{host.url}/cat.jpg").mime_type == "image/jpeg"


def test_a_body_declared_over_the_cap_is_refused_before_it_is_read(host):
    message = refusal(f"{host.url}/huge.png")
    assert f"over the {CAP:,} an image may be" in message
    assert host.sent.get("/huge.png", 0) < len(PNG) * 4000


def test_a_body_of_no_declared_length_is_read_only_past_the_cap(host):
    message = refusal(f"{host.url}/endless.png")
    assert f"sent more than the {CAP:,} bytes" in message
    time.sleep(0.2)  # the host notices the closed connection
    assert host.sent["/endless.png"] < len(PNG) * 100_000


@pytest.mark.parametrize(("path", "words"), [
    ("/page.html", "is 'text/html' (its Content-Type): images are taken as image/png"),
    ("/untyped", "is 'untyped' (its Content-Type)"),
    ("/zipped.png", "came gzip-encoded"),
    ("/missing.png", "answered 404 Not Found"),
])
def test_what_is_not_an_image_is_refused_with_the_reason(host, path, words):
    assert words in refusal(f"{host.url}{path}")


def test_bytes_that_are_not_the_type_the_server_names_are_refused_by_the_decoder(host):
    got = fetch(f"{host.url}/mislabeled.png")
    with pytest.raises(ImageInputError, match="declares image/png but its bytes are not a PNG"):
        decode_image_bytes(got.data, got.mime_type, WHERE)


@pytest.mark.parametrize("path", ["/slow.png", "/trickle.png"])
def test_a_server_that_sends_too_slowly_is_given_up_within_the_timeout(host, path):
    started = time.monotonic()
    message = refusal(f"{host.url}{path}", RemoteImages(True, True, timeout=0.5))
    assert "sent no whole image within 0.5 s" in message
    assert time.monotonic() - started < 2.0


def test_a_redirect_is_followed_to_the_image(host):
    assert fetch(f"{host.url}/moved.png").data == PNG


def test_a_redirect_to_a_file_is_refused(host):
    message = refusal(f"{host.url}/to-file")
    assert "redirects to file:/etc/passwd: only http and https URLs are fetched" in message


def test_redirects_in_a_circle_end_after_a_few(host):
    before = len(host.requests)
    message = refusal(f"{host.url}/loop", RemoteImages(True, True, max_redirects=3))
    assert "redirects more than 3 times" in message
    assert len(host.requests) - before == 4


def test_an_address_on_this_machine_is_refused_unless_private_hosts_are_allowed(host):
    before = len(host.requests)
    message = refusal(f"{host.url}/cat.png", RemoteImages(allowed=True))
    assert "is at 127.0.0.1, an address on this machine or a private network" in message
    assert "--allow-private-image-hosts" in message
    assert len(host.requests) == before  # refused before any connection


def test_localhost_is_checked_by_the_addresses_it_resolves_to(host):
    port = host.url.rsplit(":", 1)[1]
    message = refusal(f"http://localhost:{port}/cat.png", RemoteImages(allowed=True))
    assert "an address on this machine or a private network" in message


def test_a_host_is_tried_at_each_of_its_addresses_in_turn(host, monkeypatch):
    """images.test resolves to 127.0.0.2 (where nothing listens) and then 127.0.0.1."""
    port = int(host.url.rsplit(":", 1)[1])
    resolve = socket.getaddrinfo

    def two_addresses(name, *args, **kwargs):
        if name != "images.test":
            return resolve(name, *args, **kwargs)
        return [(socket.AF_INET, socket.SOCK_STREAM, 6, "", (address, port))
                for address in ("127.0.0.2", "127.0.0.1")]

    monkeypatch.setattr(socket, "getaddrinfo", two_addresses)
    assert fetch(f"http://images.test:{port}/cat.png").data == PNG
    assert host.requests[-1][1]["Host"] == f"images.test:{port}"


@pytest.mark.parametrize(("url", "words"), [("ftp://example.com/cat.png", "only http and https"),
                                           ("http:///cat.png", "names no host")])
def test_other_schemes_and_hostless_urls_are_refused(url, words):
    assert words in refusal(url)


@pytest.fixture
def tls_host(tmp_path):
    """The host under TLS with a certificate for localhost, and a client context that trusts
    that certificate."""
    pytest.importorskip("cryptography")
    cert, key = localhost_certificate(tmp_path)
    server = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server.load_cert_chain(cert, key)
    names: list[str] = []
    server.sni_callback = lambda _socket, name, _context: names.append(name)
    with image_host(PNG, JPEG, tls=server) as host:
        yield host, ssl.create_default_context(cafile=str(cert)), names


def test_an_https_url_is_fetched_from_the_checked_address_under_its_own_name(tls_host,
                                                                           monkeypatch):
    """The connection goes to the address resolved and checked here (localhost's, ::1 first
    where it has one, refused, then 127.0.0.1), while TLS and the Host header keep the URL's
    name: the certificate for localhost is what is verified."""
    host, trusting, names = tls_host
    client = httpx.AsyncClient
    monkeypatch.setattr(remote_images.httpx, "AsyncClient",
                        lambda **options: client(verify=trusting, **options))
    assert fetch(f"{host.url}/cat.png").data == PNG
    assert names == ["localhost"]
    assert host.requests[-1][1]["Host"] == host.url.removeprefix("https://")


def test_an_https_host_whose_certificate_is_not_trusted_is_refused(tls_host):
    host, _trusting, _names = tls_host
    assert "certificate verify failed" in refusal(f"{host.url}/cat.png")


@pytest.mark.parametrize(("address", "public"), [
    ("93.184.215.14", True), ("2606:4700::1111", True),
    ("127.0.0.1", False), ("10.1.2.3", False), ("172.16.0.9", False), ("192.168.1.1", False),
    ("169.254.169.254", False), ("100.64.0.1", False), ("0.0.0.0", False),
    ("224.0.0.1", False), ("::1", False), ("fe80::1%2", False), ("fd00::1", False),
    ("::ffff:127.0.0.1", False), ("2002:7f00:1::", False),
])
def test_only_public_addresses_count_as_public(address, public):
    assert is_public(address) is public
