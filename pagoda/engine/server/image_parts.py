"""A chat's `image_url` parts read for a model that takes images: each decoded and bounded
(pagoda/engine/multimodal/images.py), kept in the order it comes, and replaced in its message's
text by the model's image marker, which the prompt's encoding turns into the image's
placeholders (pagoda/engine/multimodal/placeholders.py)."""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass, field

from pagoda.engine.errors import ImageInputError
from pagoda.engine.multimodal.images import DecodedImage, ImageLimits, decode_image_url
from pagoda.engine.multimodal.placeholders import ImagePrompt
from pagoda.engine.server.errors import APIError

# Images one request may carry: each is decoded, resized and encoded by the tower.
MAX_IMAGES = 16
# OpenAI's `detail`: "low" asks for a smaller image than the model's processor makes, which this
# server does not make; "auto" and "high" get the processor's whole size.
_DETAILS = (None, "auto", "high")


@dataclass(slots=True)
class ChatImages:
    """The images of one chat as its parts are read."""

    prompt: ImagePrompt
    limits: ImageLimits = field(default_factory=ImageLimits)
    images: list[DecodedImage] = field(default_factory=list)

    @classmethod
    def reader(cls, prompt: ImagePrompt | None) -> ChatImages | None:
        """What reads a chat's images for a model that takes them (prompt: its ImagePrompt);
        None for one that takes text only (an image part is then refused in words)."""
        return None if prompt is None else cls(prompt)

    def expand(self) -> Callable[[str], str] | None:
        """What turns the rendered chat's markers into placeholders, once images were read."""
        if not self.images:
            return None
        return functools.partial(self.prompt.expand, sizes=[i.size for i in self.images])

    def image(self, url: str, detail: str | None, path: str, url_path: str,
              error: type[APIError] = APIError) -> str:
        """The marker that stands for the part's image in its message's text (path: the
        part's place in the request, url_path: its URL's; error: what names them)."""
        if detail not in _DETAILS:
            detail_path = url_path.rsplit(".", 1)[0] + ".detail"
            raise error(400, f"{detail_path} is {detail!r}: this server gives an image the "
                                "model's whole input size; send 'auto' or leave it out",
                           param=detail_path)
        if len(self.images) >= MAX_IMAGES:
            raise error(400, f"{path} is image {len(self.images) + 1} of this chat: at most "
                             f"{MAX_IMAGES} are read in one request", param=path)
        try:
            self.images.append(decode_image_url(url, url_path, self.limits))
        except ImageInputError as refused:
            raise error(400, str(refused), param=url_path) from None
        return self.prompt.marker

    def text(self, text: str, path: str) -> str:
        """A text part's text, refused where it holds the marker (it would be taken for an
        image)."""
        if self.prompt.marker in text:
            raise APIError(400, f"{path}.text holds {self.prompt.marker!r}, which this model "
                                "reads as an image: send images as image_url parts",
                           param=f"{path}.text")
        return text
