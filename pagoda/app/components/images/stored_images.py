"""An image as the store keeps it and as a backend is sent it: the same bytes, two records
(the store and the backends import neither each other)."""

from __future__ import annotations

from pagoda.app.backends import ChatImage
from pagoda.app.components.shared.view_models import ImageView
from pagoda.app.store import MessageImage, NewImage


def to_new_image(image: ChatImage) -> NewImage:
    return NewImage(image.name, image.mime_type, image.width, image.height, image.data)


def to_chat_image(kept: MessageImage) -> ChatImage:
    image = kept.image
    return ChatImage(image.mime_type, image.data, image.width, image.height, image.name)


def image_view(image: ChatImage) -> ImageView:
    return ImageView(image.name, image.mime_type, image.width, image.height, image.data)


def kept_image_view(kept: MessageImage) -> ImageView:
    return image_view(to_chat_image(kept))
