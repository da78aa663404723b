"""An image_url part's data: URL becomes RGB pixels, or a clear error naming the part and the
fault: every size bounded before it is allocated, and never a crash."""

import base64
import io
import re
import struct
import time
import zlib

import pytest
from PIL import Image

from pagoda.engine.errors import ImageInputError
from pagoda.engine.multimodal.images import (
    ImageLimits,
    decode_image_bytes,
    decode_image_url,
)

WHERE = "messages[0].content[1]"


def picture(width: int = 24, height: int = 16, shade: int = 0) -> Image.Image:
    image = Image.new("RGB", (width, height))
    image.putdata([((x * 10 + shade) % 256, (y * 15) % 256, 128)
                   for y in range(height) for x in range(width)])
    return image


def encoded(image: Image.Image, fmt: str, **options) -> bytes:
    out = io.BytesIO()
    image.save(out, format=fmt, **options)
    return out.getvalue()


def data_url(data: bytes, mime_type: str) -> str:
    return f"data:{mime_type};base64,{base64.b64encode(data).decode()}"


@pytest.mark.parametrize(("fmt", "mime_type", "options"), [
    ("PNG", "image/png", {}),
    ("WEBP", "image/webp", {"lossless": True}),
    ("GIF", "image/gif", {}),
])
def test_a_lossless_image_decodes_to_its_own_pixels(fmt, mime_type, options):
    image = picture()
    got = decode_image_url(data_url(encoded(image, fmt, **options), mime_type), WHERE)
    assert got.size == (24, 16) and got.image.mode == "RGB" and got.mime_type == mime_type
    if fmt != "GIF":  # a GIF's palette rounds the colours
        assert got.image.tobytes() == image.tobytes()


def test_a_jpeg_decodes_to_rgb_of_its_size():
    got = decode_image_url(data_url(encoded(picture(40, 30), "JPEG"), "image/jpeg"), WHERE)
    assert got.size == (40, 30) and got.image.mode == "RGB"


def test_an_animated_gif_gives_its_first_frame():
    first, second = picture(shade=0), picture(shade=100)
    data = encoded(first, "GIF", save_all=True, append_images=[second], duration=100)
    got = decode_image_url(data_url(data, "image/gif"), WHERE)
    want = decode_image_url(data_url(encoded(first, "GIF"), "image/gif"), WHERE)
    assert got.content_hash == want.content_hash


def test_the_same_pixels_in_another_encoding_are_the_same_image():
    image = picture()
    png = decode_image_url(data_url(encoded(image, "PNG"), "image/png"), WHERE)
    webp = decode_image_url(data_url(encoded(image, "WEBP", lossless=True), "image/webp"), WHERE)
    other = decode_image_url(data_url(encoded(picture(shade=1), "PNG"), "image/png"), WHERE)
    assert png.content_hash == webp.content_hash != other.content_hash


def test_a_truncated_png_is_refused_as_damaged():
    data = encoded(picture(64, 64), "PNG")
    with pytest.raises(ImageInputError, match=re.escape(f"{WHERE} is not a whole PNG image")):
        decode_image_url(data_url(data[: len(data) // 2], "image/png"), WHERE)


def _png_declaring(width: int, height: int) -> bytes:
    """A PNG whose header declares width x height RGB pixels, with a few bytes of data."""
    def chunk(kind: bytes, body: bytes) -> bytes:
        return (struct.pack(">I", len(body)) + kind + body
                + struct.pack(">I", zlib.crc32(kind + body)))
    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header)
            + chunk(b"IDAT", zlib.compress(b"\x00" * 64)) + chunk(b"IEND", b""))


@pytest.mark.parametrize("side", [100_000, 9_000])
def test_a_decompression_bomb_is_refused_from_its_header(side):
    """100,000 x 100,000 pixels (30 GB as RGB) and 9,000 x 9,000 (81 MP, under Pillow's own
    bomb limit) declared in under 100 bytes: refused before any pixel is allocated."""
    began = time.perf_counter()
    with pytest.raises(ImageInputError, match="pixels"):
        decode_image_url(data_url(_png_declaring(side, side), "image/png"), WHERE)
    assert time.perf_counter() - began < 1


def test_a_side_over_the_bound_is_refused():
    with pytest.raises(ImageInputError, match="20,000 x 1 pixels"):
        decode_image_url(data_url(_png_declaring(20_000, 1), "image/png"), WHERE)


def test_bytes_of_another_type_than_declared_are_refused():
    jpeg = encoded(picture(), "JPEG")
    with pytest.raises(ImageInputError, match="declares image/png but its bytes are not a PNG"):
        decode_image_url(data_url(jpeg, "image/png"), WHERE)


def test_something_that_is_not_an_image_is_refused():
    with pytest.raises(ImageInputError, match="not a PNG"):
        decode_image_url(data_url(b"%PDF-1.7 not an image at all", "image/png"), WHERE)


@pytest.mark.parametrize("mime_type", ["image/bmp", "text/plain", "application/pdf"])
def test_a_type_pagoda_does_not_take_is_refused_by_name(mime_type):
    with pytest.raises(ImageInputError, match=rf"declares '{mime_type}'.*image/png"):
        decode_image_url(data_url(b"anything", mime_type), WHERE)


def test_an_image_over_the_byte_bound_is_refused_before_decoding_its_base64():
    limits = ImageLimits(max_bytes=1000)
    huge = "data:image/png;base64," + "A" * 4_000_000  # not decoded: its length says enough
    with pytest.raises(ImageInputError, match="over the 1,000 an image may be"):
        decode_image_url(huge, WHERE, limits)
    data = encoded(picture(64, 64), "PNG")
    with pytest.raises(ImageInputError, match="bytes, over the 100"):
        decode_image_bytes(data, "image/png", WHERE, ImageLimits(max_bytes=100))


def test_invalid_base64_is_refused():
    with pytest.raises(ImageInputError, match="not valid base64"):
        decode_image_url("data:image/png;base64,iVBOR***", WHERE)


@pytest.mark.parametrize(("url", "words"), [
    ("https://example.com/cat.png", "remote URL: this server does not fetch remote images"),
    ("http://example.com/cat.png", "remote URL"),
    ("data:image/png,rawbytes", "not base64"),
    ("data:image/png;base64", "without a comma"),
    ("file:///etc/passwd", "neither a data: URL nor an http"),
])
def test_urls_pagoda_does_not_read_are_refused_with_the_reason(url, words):
    with pytest.raises(ImageInputError, match=words):
        decode_image_url(url, WHERE)
