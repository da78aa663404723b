"""The images waiting in the composer for the next message: from files (the paperclip, a drop,
files pasted) or an image pasted itself. Each is read and checked off the event loop as it
comes (pagoda.app.backends.images), so one that cannot be used is refused in words at once,
and the rest stay until they are sent or taken off. No Qt."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from pagoda.app.backends import ChatImage
from pagoda.app.backends.images import LIMITS, UnusableImageError, read_image
from pagoda.app.components.images.stored_images import image_view
from pagoda.app.components.shared.view_models import ImageView

PASTED_NAME = "pasted image"
# As many as the store keeps with one message (pagoda.app.store's MAX_IMAGES_PER_MESSAGE).
MAX_PENDING = 16


class PendingImages:
    """`images` in the order given; `on_changed(views)` after each change, `on_refused(words)`
    for an image that cannot be used (it is not added). Images are read on a thread of their
    own (`pagoda-images`, made on the first, ended by `close`), not the loop's executor: the
    window's loop (qasync) runs that on QThreads nobody stops at exit."""

    def __init__(self) -> None:
        self.images: list[ChatImage] = []
        self.on_changed: Callable[[list[ImageView]], None] = lambda _views: None
        self.on_refused: Callable[[str], None] = lambda _words: None
        self._reader: ThreadPoolExecutor | None = None

    async def add_files(self, paths: list[str]) -> None:
        for path in paths:
            await self._read(_read_file, path)

    async def add_pasted(self, data: bytes, mime_type: str = "image/png") -> None:
        """An image pasted from the clipboard, as the window encoded it (PNG)."""
        await self._read(read_image, data, PASTED_NAME, mime_type)

    def close(self) -> None:
        if self._reader is not None:
            self._reader.shutdown(wait=False, cancel_futures=True)

    async def _read(self, read: Callable[..., ChatImage], *args: object) -> None:
        if self._reader is None:
            self._reader = ThreadPoolExecutor(max_workers=1, thread_name_prefix="pagoda-images")
        loop = asyncio.get_running_loop()
        try:
            image = await loop.run_in_executor(self._reader, read, *args)
        except UnusableImageError as exc:
            self.on_refused(str(exc))
            return
        self._add(image)

    def remove(self, index: int) -> None:
        if 0 <= index < len(self.images):
            del self.images[index]
            self._changed()

    def take(self) -> tuple[ChatImage, ...]:
        """The images, for the message being sent; the composer is left without them."""
        taken = tuple(self.images)
        self.images.clear()
        self._changed()
        return taken

    def give_back(self, images: tuple[ChatImage, ...]) -> None:
        """Images a send could not store go back to the composer, before any added since."""
        self.images[:0] = images
        self._changed()

    @property
    def views(self) -> list[ImageView]:
        return [image_view(image) for image in self.images]

    def _add(self, image: ChatImage) -> None:
        if len(self.images) >= MAX_PENDING:
            self.on_refused(f"{image.name} was not added: a message takes at most {MAX_PENDING} "
                            "images")
            return
        self.images.append(image)
        self._changed()

    def _changed(self) -> None:
        self.on_changed(self.views)


def _read_file(path: str) -> ChatImage:
    """The file's image; its size is bounded before any of it is read."""
    name = Path(path).name
    try:
        size = os.stat(path).st_size
        if size > LIMITS.max_bytes:
            raise UnusableImageError(f"{name} is {size / 2**20:.1f} MB, over the "
                                     f"{LIMITS.max_bytes / 2**20:.1f} MB an image may be")
        data = Path(path).read_bytes()
    except OSError as exc:
        raise UnusableImageError(f"{name} cannot be read: {exc.strerror or exc}") from None
    return read_image(data, name)
