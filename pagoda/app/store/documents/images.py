"""Images kept with user messages: adding them within their bounds, reading them back with a
branch or an export. Functions of a session: ConversationStore opens the sessions.

The store keeps an image's bytes as they were given; it does not decode them (it imports no
image library): the app reads and checks an image before it asks the store to keep it
(pagoda.app.backends.images), and an import's images are bounded by size and declared type
(transfer.validation) and shown as damaged where their bytes are not an image."""

from __future__ import annotations

from collections.abc import Sequence

from sqlalchemy import select
from sqlalchemy.orm import Session

from ..errors import StoreError
from ..records import MessageImage, NewImage
from ..schema import MessageImageRow, MessageRow

# An image's encoded bytes: what a phone's photo takes, and what the engine's own bound on an
# image part is (pagoda.engine.multimodal.images.ImageLimits.max_bytes).
MAX_IMAGE_BYTES = 20 * 1024 * 1024
MAX_IMAGES_PER_MESSAGE = 16
# Either side in pixels, as the engine bounds it.
MAX_IMAGE_SIDE = 16_384
IMAGE_TYPES = ("image/png", "image/jpeg", "image/webp", "image/gif")


class ImageRefusedError(StoreError):
    """An image the store does not keep: too large, of a type it does not take, or one too many
    for its message."""


def check(image: NewImage) -> None:
    """ImageRefusedError, naming the image and the bound, for one the store does not keep."""
    if len(image.data) > MAX_IMAGE_BYTES:
        raise ImageRefusedError(
            f"{image.name} is {_megabytes(len(image.data))}, over the "
            f"{_megabytes(MAX_IMAGE_BYTES)} an image kept with a chat may be: make it smaller "
            "(a screenshot of part of it, or a JPEG at lower quality)")
    if image.mime_type not in IMAGE_TYPES:
        raise ImageRefusedError(f"{image.name} is {image.mime_type}: images are kept as "
                                f"{', '.join(IMAGE_TYPES)}")
    if not (0 < image.width <= MAX_IMAGE_SIDE and 0 < image.height <= MAX_IMAGE_SIDE):
        raise ImageRefusedError(f"{image.name} is {image.width} x {image.height} pixels: a "
                                f"side is 1 to {MAX_IMAGE_SIDE:,}")


def add(s: Session, message: MessageRow, images: Sequence[NewImage],
        ids: Sequence[int | None] = ()) -> list[MessageImage]:
    """Keep `images` with the user's `message`, after those it has, under `ids` where given."""
    if message.role != "user":
        raise StoreError(f"message {message.id} is a {message.role} message: images come "
                         "with the user's messages")
    held = len(s.scalars(select(MessageImageRow.id)
                         .where(MessageImageRow.message_id == message.id)).all())
    if held + len(images) > MAX_IMAGES_PER_MESSAGE:
        raise ImageRefusedError(f"a message holds at most {MAX_IMAGES_PER_MESSAGE} images: "
                                "send the others with the next message")
    for image in images:
        check(image)
    rows = [MessageImageRow(id=(ids[i] if i < len(ids) else None), message_id=message.id,
                            position=held + i, name=image.name, mime_type=image.mime_type,
                            width=image.width, height=image.height, data=image.data)
            for i, image in enumerate(images)]
    s.add_all(rows)
    s.flush()
    return [_image(row) for row in rows]


def of_messages(s: Session, message_ids: Sequence[int]) -> dict[int, tuple[MessageImage, ...]]:
    """Each of those messages' images, in their order; a message without any is left out."""
    if not message_ids:
        return {}
    query = (select(MessageImageRow).where(MessageImageRow.message_id.in_(list(message_ids)))
             .order_by(MessageImageRow.message_id, MessageImageRow.position))
    found: dict[int, list[MessageImage]] = {}
    for row in s.scalars(query):
        found.setdefault(row.message_id, []).append(_image(row))
    return {mid: tuple(images) for mid, images in found.items()}


def taken(s: Session, ids: Sequence[int]) -> bool:
    """Whether any of those image ids is in use."""
    return bool(ids) and s.scalars(select(MessageImageRow.id)
                                   .where(MessageImageRow.id.in_(list(ids))).limit(1)).first() \
        is not None


def _image(row: MessageImageRow) -> MessageImage:
    return MessageImage(row.id, row.message_id,
                        NewImage(row.name, row.mime_type, row.width, row.height, row.data))


def _megabytes(n: int) -> str:
    return f"{n / (1024 * 1024):.1f} MB"
