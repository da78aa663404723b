"""A chat's `image_url` parts read for a model that takes images: each replaced in its
message's text by the model's image marker, which the prompt's encoding turns into the image's
placeholders (pagoda/engine/multimodal/placeholders.py), then read in the order they came:
fetched where the URL is remote and the server fetches (pagoda/engine/server/remote_images.py),
decoded and bounded (pagoda/engine/multimodal/images.py) on a worker thread, so neither a slow
image host nor a large decode holds up the server's other requests."""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable
from dataclasses import dataclass, field

from pagoda.engine.errors import ImageInputError
from pagoda.engine.multimodal.images import (
    DecodedImage,
    ImageLimits,
    decode_image_bytes,
    decode_image_url,
)
from pagoda.engine.multimodal.placeholders import ImagePrompt
from pagoda.engine.server.errors import APIError
from pagoda.engine.server.remote_images import RemoteImages, fetch_image

# Images one request may carry: each is decoded, resized and encoded by the tower.
MAX_IMAGES = 16
# OpenAI's `detail`: "low" asks for a smaller image than the model's processor makes, which this
# server does not make; "auto" and "high" get the processor's whole size.
_DETAILS = (None, "auto", "high")


@dataclass(frozen=True, slots=True)
class _ImagePart:
    url: str
    path: str  # the URL's place in the request
    error: type[APIError]  # what names that place as its API does


@dataclass(slots=True)
class ChatImages:
    """The images of one chat: its parts as they are met (`image`), then read (`read`)."""

    prompt: ImagePrompt
    remote: RemoteImages = field(default_factory=RemoteImages)
    limits: ImageLimits = field(default_factory=ImageLimits)
    images: list[DecodedImage] = field(default_factory=list)
    parts: list[_ImagePart] = field(default_factory=list)

    @classmethod
    def reader(cls, prompt: ImagePrompt | None,
               remote: RemoteImages = RemoteImages()) -> ChatImages | None:
        """What reads a chat's images for a model that takes them (prompt: its ImagePrompt;
        remote: whether and how the server fetches http(s) URLs); None for one that takes text
        only (an image part is then refused in words)."""
        return None if prompt is None else cls(prompt, remote)

    async def read(self) -> None:
        """Every part's image, in order; the first that cannot be read is a 400 naming it."""
        for part in self.parts:
            try:
                self.images.append(await self._decoded(part))
            except ImageInputError as refused:
                raise part.error(400, str(refused), param=part.path) from None

    async def _decoded(self, part: _ImagePart) -> DecodedImage:
        if self.remote.allowed and part.url.startswith(("http://", "https://")):
            fetched = await fetch_image(part.url, part.path, self.remote, self.limits.max_bytes)
            return await asyncio.to_thread(decode_image_bytes, fetched.data, fetched.mime_type,
                                           part.path, self.limits)
        return await asyncio.to_thread(decode_image_url, part.url, part.path, self.limits)

    def expand(self) -> Callable[[str], str] | None:
        """What turns the rendered chat's markers into placeholders, once images were read
        (each image's for its size: SmolVLM's tiles, Qwen2.5-VL's merge units)."""
        if not self.images:
            return None
        return functools.partial(self.prompt.expand, sizes=[i.size for i in self.images])

    def image(self, url: str, detail: str | None, path: str, url_path: str,
              error: type[APIError] = APIError) -> str:
        """The marker that stands for the part's image in its message's text, the image to be
        read (path: the part's place in the request, url_path: its URL's; error: what names
        them)."""
        if detail not in _DETAILS:
            detail_path = url_path.rsplit(".", 1)[0] + ".detail"
            raise error(400, f"{detail_path} is {detail!r}: this server gives an image the "
                                "model's whole input size; send 'auto' or leave it out",
                           param=detail_path)
        if len(self.parts) >= MAX_IMAGES:
            raise error(400, f"{path} is image {len(self.parts) + 1} of this chat: at most "
                             f"{MAX_IMAGES} are read in one request", param=path)
        self.parts.append(_ImagePart(url, url_path, error))
        return self.prompt.marker

    def text(self, text: str, path: str) -> str:
        """A text part's text, refused where it holds the marker (it would be taken for an
        image)."""
        if self.prompt.marker in text:
            raise APIError(400, f"{path}.text holds {self.prompt.marker!r}, which this model "
                                "reads as an image: send images as image_url parts",
                           param=f"{path}.text")
        return text
