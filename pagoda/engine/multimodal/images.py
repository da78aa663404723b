"""Images from a chat's `image_url` parts: a `data:` URL decoded to RGB pixels, every size an
outsider controls bounded before anything is allocated for it.

The checks run cheapest first: the URL's scheme and declared type, the base64 text's length
(so a huge body is refused before it is decoded), the bytes' own signature against the declared
type, the pixel count the header declares (a decompression bomb declares billions of pixels in a
few bytes; Pillow reads only the header until `load`), then the decode itself, which a truncated
or damaged file fails. A GIF or an animated WebP gives its first frame, as llama.cpp's mtmd and
Hugging Face's processors do.

An image's identity for the prefix cache is the hash of its decoded pixels and size, not of its
bytes: the same picture re-encoded (a PNG pasted twice, a JPEG saved again losslessly) is the
same image to the model.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import io
import warnings
from dataclasses import dataclass

from PIL import Image, UnidentifiedImageError

from pagoda.engine.errors import ImageInputError

# The types a data URL may declare, with the signatures their bytes start with.
_SIGNATURES = {
    "image/png": (b"\x89PNG\r\n\x1a\n",),
    "image/jpeg": (b"\xff\xd8\xff",),
    "image/webp": (b"RIFF",),  # then 4 bytes of length and "WEBP": checked apart
    "image/gif": (b"GIF87a", b"GIF89a"),
}
_PIL_FORMATS = {"image/png": "PNG", "image/jpeg": "JPEG", "image/webp": "WEBP",
                "image/gif": "GIF"}
ACCEPTED_TYPES = tuple(_SIGNATURES)


@dataclass(frozen=True, slots=True)
class ImageLimits:
    """max_bytes: the encoded image's size; max_pixels: width x height as its header declares
    them; max_side: either side. The defaults take any photo a phone takes (48 MP is 8064 x
    6048) and refuse what no model's processor would use whole."""

    max_bytes: int = 20 * 1024 * 1024
    max_pixels: int = 50_000_000
    max_side: int = 16_384


@dataclass(frozen=True, slots=True)
class DecodedImage:
    """An image's RGB pixels, its declared type, and the hash that identifies it."""

    image: Image.Image
    mime_type: str
    content_hash: str

    @property
    def size(self) -> tuple[int, int]:
        return self.image.size


def decode_image_url(url: str, where: str, limits: ImageLimits = ImageLimits()) -> DecodedImage:
    """The image a part's data: URL holds; ImageInputError naming `where` (the part's path in
    the request) and the fault otherwise. An http(s) URL is the server's to fetch, when it was
    started to (pagoda/engine/server/remote_images.py): here it is refused."""
    if url.startswith(("http://", "https://")):
        raise ImageInputError(f"{where} is a remote URL: this server does not fetch remote "
                              "images; send the image inline as a data: URL "
                              "(data:image/png;base64,...), or start the server with "
                              "--allow-remote-images")
    mime_type, payload = _split_data_url(url, where)
    data = _decode_base64(payload, where, limits)
    return decode_image_bytes(data, mime_type, where, limits)


def decode_image_bytes(data: bytes, mime_type: str, where: str,
                       limits: ImageLimits = ImageLimits()) -> DecodedImage:
    """Encoded image bytes of a declared type (a data URL's, a fetched URL's by its
    Content-Type, or a file the window attaches)."""
    if mime_type not in _SIGNATURES:
        raise ImageInputError(f"{where} declares {mime_type!r}: images are taken as "
                              f"{', '.join(ACCEPTED_TYPES)}")
    if len(data) > limits.max_bytes:
        raise ImageInputError(f"{where} is {len(data):,} bytes, over the {limits.max_bytes:,} "
                              "an image may be")
    if not _has_signature(data, mime_type):
        raise ImageInputError(f"{where} declares {mime_type} but its bytes are not a "
                              f"{mime_type.split('/')[1].upper()} image")
    image = _open_checked(data, mime_type, where, limits)
    rgb = image.convert("RGB")
    digest = hashlib.sha256(f"{rgb.width}x{rgb.height}:".encode())
    digest.update(rgb.tobytes())
    return DecodedImage(rgb, mime_type, digest.hexdigest())


def _split_data_url(url: str, where: str) -> tuple[str, str]:
    if not url.startswith("data:"):
        raise ImageInputError(f"{where} is neither a data: URL nor an http(s) one")
    header, comma, payload = url[len("data:"):].partition(",")
    if not comma:
        raise ImageInputError(f"{where} is a data: URL without a comma before its data")
    mime_type, *params = header.split(";")
    if "base64" not in params:
        raise ImageInputError(f"{where} is a data: URL that is not base64 "
                              "(data:image/png;base64,...)")
    return mime_type.strip().lower(), payload


def _decode_base64(payload: str, where: str, limits: ImageLimits) -> bytes:
    # Four characters of base64 hold three bytes: the text's length bounds the bytes before any
    # are decoded.
    if len(payload) // 4 * 3 > limits.max_bytes + 3:
        raise ImageInputError(f"{where} holds about {len(payload) // 4 * 3:,} bytes, over the "
                              f"{limits.max_bytes:,} an image may be")
    try:
        return base64.b64decode(payload, validate=True)
    except (binascii.Error, ValueError) as e:
        raise ImageInputError(f"{where}'s data is not valid base64: {e}") from None


def _has_signature(data: bytes, mime_type: str) -> bool:
    if not data.startswith(_SIGNATURES[mime_type]):
        return False
    return mime_type != "image/webp" or data[8:12] == b"WEBP"


def _open_checked(data: bytes, mime_type: str, where: str,
                  limits: ImageLimits) -> Image.Image:
    """The first frame, decoded, once the header's size is within the limits."""
    try:
        with warnings.catch_warnings():
            # Pillow's own bomb check warns or raises at its limit; ours comes first and says
            # the sizes in words.
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)
            image = Image.open(io.BytesIO(data), formats=[_PIL_FORMATS[mime_type]])
            width, height = image.size
            _check_size(width, height, where, limits)
            image.seek(0)
            image.load()
    except ImageInputError:
        raise
    except Image.DecompressionBombError:
        raise ImageInputError(f"{where} declares more pixels than an image may have") from None
    except (UnidentifiedImageError, OSError, SyntaxError, ValueError, EOFError) as e:
        raise ImageInputError(f"{where} is not a whole {mime_type.split('/')[1].upper()} "
                              f"image (damaged or truncated): {e}") from None
    return image


def _check_size(width: int, height: int, where: str, limits: ImageLimits) -> None:
    if width < 1 or height < 1:
        raise ImageInputError(f"{where} is {width} x {height} pixels: an image has at least one")
    if max(width, height) > limits.max_side or width * height > limits.max_pixels:
        raise ImageInputError(
            f"{where} is {width:,} x {height:,} pixels, over the bounds of {limits.max_side:,} a "
            f"side and {limits.max_pixels:,} in all")
