"""An image part's http(s) URL fetched, for a server started with --allow-remote-images.

Whoever sends a request chooses the URL, so the fetch is bounded as a data: URL's bytes are:
only http and https (a redirect to file:, ftp: or anything else is refused), a deadline for
the whole fetch (a server that sends a byte a second still ends in time), a byte cap read as
the body streams in (a Content-Length over the cap is refused before the body; a body without
one is read until the cap is passed, never to its end), the body sent as it is stored
(Accept-Encoding: identity; a compressed body could unpack to far more than the cap),
its Content-Type one of the image types, whose bytes' signature the decoder checks against
it, and a few redirects at most.

The address: the server may sit beside services that trust their network (a router's page, a
cloud's metadata at 169.254.169.254, a database on 127.0.0.1), and a fetch on a client's behalf
must not reach them for it. So the host is resolved here, every address it resolves to must be
public, and the connection goes to the address that was checked (the Host header and TLS's
server name keep the URL's name), so a name that resolves again to another address between the
check and the connection (DNS rebinding) reaches nothing new. Every redirect's host is checked
the same way. --allow-private-image-hosts fetches from loopback, private and link-local addresses
too (a server on a home network with a picture store beside it). No proxy from the environment
is used: it would connect on our behalf to an address we never checked.
"""

from __future__ import annotations

import asyncio
import ipaddress
import socket
from dataclasses import dataclass

import httpx

from pagoda.engine.errors import ImageInputError
from pagoda.engine.multimodal.images import ACCEPTED_TYPES

_SCHEMES = ("http", "https")
_REDIRECTS = (301, 302, 303, 307, 308)


@dataclass(frozen=True, slots=True)
class RemoteImages:
    """How an image part's http(s) URL is treated. allowed: fetched at all
    (--allow-remote-images); private_hosts: from any address, not only public ones
    (--allow-private-image-hosts); timeout: seconds for one image's whole fetch, redirects
    included (--remote-image-timeout); max_redirects: how many redirects one fetch follows."""

    allowed: bool = False
    private_hosts: bool = False
    timeout: float = 10.0
    max_redirects: int = 3


@dataclass(frozen=True, slots=True)
class FetchedImage:
    """An image's bytes as its server sent them, and the type its Content-Type names."""

    data: bytes
    mime_type: str


async def fetch_image(url: str, where: str, policy: RemoteImages,
                      max_bytes: int) -> FetchedImage:
    """The image at `url` (where: the part's path in the request); ImageInputError naming
    `where` and the fault."""
    target = _checked_url(url, where)
    try:
        async with asyncio.timeout(policy.timeout):
            async with httpx.AsyncClient(trust_env=False, follow_redirects=False,
                                         timeout=policy.timeout) as client:
                for _ in range(policy.max_redirects + 1):
                    got = await _fetch_once(client, target, where, policy, max_bytes)
                    if isinstance(got, FetchedImage):
                        return got
                    target = _checked_url(str(got), where, redirected_from=target)
    except (TimeoutError, httpx.TimeoutException):
        raise ImageInputError(f"{where}: {url} sent no whole image within "
                              f"{policy.timeout:g} s") from None
    except httpx.HTTPError as e:
        raise ImageInputError(f"{where}: fetching {url} failed: {e or type(e).__name__}") from None
    raise ImageInputError(f"{where}: {url} redirects more than {policy.max_redirects} times")


def _checked_url(url: str, where: str, redirected_from: httpx.URL | None = None) -> httpx.URL:
    how = "" if redirected_from is None else f"{redirected_from} redirects to {url}: "
    try:
        parsed = httpx.URL(url)
    except httpx.InvalidURL as e:
        raise ImageInputError(f"{where}: {how}{url!r} is not a URL: {e}") from None
    if parsed.scheme not in _SCHEMES:
        raise ImageInputError(f"{where}: {how}only http and https URLs are fetched")
    if not parsed.host:
        raise ImageInputError(f"{where}: {how}{url} names no host")
    return parsed


async def _fetch_once(client: httpx.AsyncClient, url: httpx.URL, where: str,
                      policy: RemoteImages, max_bytes: int) -> FetchedImage | httpx.URL:
    """The image, or where a redirect points; from the first of the host's checked addresses
    that takes the connection."""
    refused: httpx.ConnectError | None = None
    for address in await _addresses(url, where, policy.private_hosts):
        try:
            response = await client.send(_pinned_request(client, url, address), stream=True)
        except httpx.ConnectError as e:
            refused = e
            continue
        try:
            return await _read(response, url, where, max_bytes)
        finally:
            await response.aclose()
    raise ImageInputError(f"{where}: could not connect to {url.host}: {refused}")


async def _addresses(url: httpx.URL, where: str, private_hosts: bool) -> list[str]:
    port = url.port or (443 if url.scheme == "https" else 80)
    try:
        found = await asyncio.get_running_loop().getaddrinfo(url.host, port,
                                                             type=socket.SOCK_STREAM)
    except socket.gaierror as e:
        raise ImageInputError(f"{where}: the host {url.host!r} was not found "
                              f"({e.strerror})") from None
    addresses = list(dict.fromkeys(str(info[4][0]) for info in found))
    if not private_hosts:
        for address in addresses:
            if not is_public(address):
                raise ImageInputError(
                    f"{where}: {url.host} is at {address}, an address on this machine or a "
                    "private network: this server fetches images from public addresses only "
                    "(start it with --allow-private-image-hosts to fetch from any)")
    return addresses


def is_public(address: str) -> bool:
    """Whether an IP address is reachable on the public internet (not loopback, private,
    link-local, shared, reserved or multicast), looking through IPv6's forms of an IPv4 one."""
    ip = ipaddress.ip_address(address.split("%")[0])
    if isinstance(ip, ipaddress.IPv6Address):
        inner = ip.ipv4_mapped or ip.sixtofour or (ip.teredo[1] if ip.teredo else None)
        if inner is not None:
            ip = inner
    return ip.is_global and not ip.is_multicast


def _pinned_request(client: httpx.AsyncClient, url: httpx.URL, address: str) -> httpx.Request:
    """A GET of `url` sent to `address`: the Host header and TLS's server name (which the
    certificate is checked against) keep the URL's host."""
    headers = {"Host": url.netloc.decode("ascii"), "Accept": ", ".join(ACCEPTED_TYPES),
               "Accept-Encoding": "identity"}
    extensions = {"sni_hostname": url.host} if url.scheme == "https" else {}
    return client.build_request("GET", url.copy_with(host=address), headers=headers,
                                extensions=extensions)


async def _read(response: httpx.Response, url: httpx.URL, where: str,
                max_bytes: int) -> FetchedImage | httpx.URL:
    if response.status_code in _REDIRECTS:
        location = response.headers.get("location")
        if not location:
            raise ImageInputError(f"{where}: {url} redirects ({response.status_code}) without "
                                  "a Location")
        return url.join(location)
    if response.status_code != 200:
        raise ImageInputError(f"{where}: {url} answered {response.status_code} "
                              f"{response.reason_phrase}")
    mime_type = _image_type(response, url, where)
    declared = response.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > max_bytes:
        raise ImageInputError(f"{where}: {url} is {int(declared):,} bytes, over the "
                              f"{max_bytes:,} an image may be")
    body = bytearray()
    async for chunk in response.aiter_raw():
        body += chunk
        if len(body) > max_bytes:
            raise ImageInputError(f"{where}: {url} sent more than the {max_bytes:,} bytes an "
                                  "image may be")
    return FetchedImage(bytes(body), mime_type)


def _image_type(response: httpx.Response, url: httpx.URL, where: str) -> str:
    encoding = response.headers.get("content-encoding", "identity").strip().lower()
    if encoding not in ("", "identity"):
        raise ImageInputError(f"{where}: {url} came {encoding}-encoded: this server takes an "
                              "image's bytes as they are stored")
    mime_type = response.headers.get("content-type", "").split(";")[0].strip().lower()
    if mime_type not in ACCEPTED_TYPES:
        raise ImageInputError(f"{where}: {url} is {mime_type or 'untyped'!r} (its Content-Type): "
                              f"images are taken as {', '.join(ACCEPTED_TYPES)}")
    return mime_type
