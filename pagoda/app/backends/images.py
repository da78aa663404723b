"""Images for a chat, as the window gets them (a file, a paste): read and checked once with the
engine's own decoder (pagoda.engine.multimodal.images: bytes and pixels bounded before they are
decoded), so the window, the store and a server see the same image; and counted for the meter.

The window's models reach the engine's decoder only through here (docs/ARCHITECTURE.md)."""

from __future__ import annotations

import mimetypes
from collections.abc import Sequence
from dataclasses import replace

from pagoda.app.backends.protocol import ChatBackend
from pagoda.app.backends.types import ChatImage, ChatMessage, ImageCost, TokenCount, ToolSpec
from pagoda.engine.errors import ImageInputError
from pagoda.engine.multimodal.images import ACCEPTED_TYPES, ImageLimits, decode_image_bytes

# What the engine takes (its defaults: 20 MB, 50 megapixels, 16,384 pixels a side); the store
# keeps images up to the same size (pagoda.app.store.MAX_IMAGE_BYTES).
LIMITS = ImageLimits()
IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".webp", ".gif")
# The cost the meter assumes where a backend does not say what an image costs.
GUESSED_COST = ImageCost()
TEXT_ONLY_WORDS = "{model} takes text only: it cannot see images"


class UnusableImageError(ValueError):
    """An image the app cannot use: not a PNG, JPEG, WebP or GIF, damaged or cut short, or
    over the bounds. The message names the image and the fault."""


def is_image_name(name: str) -> bool:
    """Whether a file's name says it is an image the app reads (its suffix)."""
    return name.lower().endswith(IMAGE_SUFFIXES)


def read_image(data: bytes, name: str, mime_type: str | None = None) -> ChatImage:
    """The image in `data` (its type from `mime_type`, else from `name`'s suffix), decoded once
    to check it is whole and within the bounds; UnusableImageError in words otherwise. Slow
    for a large photo: call it off the event loop."""
    declared = mime_type or mimetypes.guess_type(name)[0] or ""
    if declared not in ACCEPTED_TYPES:
        raise UnusableImageError(f"{name} is not an image the app reads: images are PNG, "
                                 "JPEG, WebP or GIF")
    try:
        decoded = decode_image_bytes(data, declared, name, LIMITS)
    except ImageInputError as exc:
        raise UnusableImageError(str(exc)) from None
    width, height = decoded.size
    return ChatImage(declared, data, width, height, name)


def text_only(messages: Sequence[ChatMessage]) -> list[ChatMessage]:
    """The messages without their images (what a backend's count_tokens counts)."""
    return [replace(m, images=()) if m.images else m for m in messages]


async def count_chat(backend: ChatBackend, messages: Sequence[ChatMessage],
                     tools: Sequence[ToolSpec] = ()) -> TokenCount:
    """The chat's prompt length with its images: the text as the backend counts it, and each
    image at the backend's cost (or GUESSED_COST, then an estimate)."""
    counted = await backend.count_tokens(text_only(messages), tools)
    images = [image for m in messages for image in m.images]
    if not images:
        return counted
    cost = backend.image_input.cost or GUESSED_COST
    tokens = sum(cost.tokens(image.width, image.height) for image in images)
    return TokenCount(counted.n + tokens, counted.exact and cost.exact)


def refusal(backend: ChatBackend) -> str | None:
    """Why this backend's model cannot be sent images, in words; None where it can (or where
    only the server can tell)."""
    if backend.image_input.accepts is not False:
        return None
    return backend.image_input.why or TEXT_ONLY_WORDS.format(model=backend.model_name)
