"""A prompt's images matched to their placeholders: each image is one run of the model's image
token, as long as the model gives an image (Gemma 3: 256), in the order the images come.

In a chat, an image part becomes the model's marker in the text the template renders
(`ImagePrompt.marker`: Gemma 3's `<start_of_image>`, which its own template writes for an image
part), and each marker becomes the whole run before the text is tokenized (`expand`), as the
family's Hugging Face processor does."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from PIL import Image

from pagoda.engine.core.image_spans import ImageSpan
from pagoda.engine.errors import ImageInputError
from pagoda.engine.multimodal.images import DecodedImage


@dataclass(slots=True, eq=False)  # hashed by identity, as the tensor it stands for was
class PendingPixels:
    """An image's pixels for the vision tower, made when the tower first asks for them: a turn
    whose prefix cache already holds the image's blocks (a follow-up question about it) never
    encodes it, so it never pays for the resize either (a 1280 x 720 photo to 896 x 896: 8 ms
    on a quiet 2-core Zen 5, 25-71 ms on a busy one; bench/image_followup_ttft.py)."""

    image: Image.Image
    processor: Callable[[Image.Image], torch.Tensor]
    _pixels: torch.Tensor | None = None

    def tensor(self) -> torch.Tensor:
        if self._pixels is None:
            self._pixels = self.processor(self.image)
        return self._pixels


def image_spans(token_ids: Sequence[int], images: Sequence[DecodedImage], image_token_id: int,
                tokens_per_image: int,
                processor: Callable[[Image.Image], torch.Tensor]) -> tuple[ImageSpan, ...]:
    """Each image's span of placeholders with its pixels to be processed; ImageInputError
    where the prompt's runs of the image token do not fit the images given."""
    runs = _runs(token_ids, image_token_id)
    if len(runs) != len(images):
        raise ImageInputError(
            f"the prompt holds placeholders for {len(runs)} image(s) but {len(images)} "
            "image(s) came with it: each image needs its own run of image tokens")
    for i, (offset, length) in enumerate(runs):
        if length != tokens_per_image:
            raise ImageInputError(
                f"image {i}'s placeholders at token {offset} are {length} tokens, where this "
                f"model gives each image {tokens_per_image}")
    return tuple(ImageSpan(offset, length, image.content_hash,
                           PendingPixels(image.image, processor))
                 for (offset, length), image in zip(runs, images, strict=True))


def _runs(token_ids: Sequence[int], token: int) -> list[tuple[int, int]]:
    """(offset, length) of each run of `token`."""
    runs: list[tuple[int, int]] = []
    for i, t in enumerate(token_ids):
        if t != token:
            continue
        if runs and runs[-1][0] + runs[-1][1] == i:
            runs[-1] = (runs[-1][0], runs[-1][1] + 1)
        else:
            runs.append((i, 1))
    return runs


@dataclass(frozen=True, slots=True)
class ImagePrompt:
    """marker: what a chat's image part is in the template's text; expansion: what each marker
    becomes before tokenizing (its image's placeholders between the model's own tokens)."""

    marker: str
    expansion: str
    tokens_per_image: int  # the placeholders in an expansion

    def expand(self, text: str) -> str:
        return text.replace(self.marker, self.expansion)


def gemma3_image_prompt(start: str, image: str, end: str, tokens_per_image: int) -> ImagePrompt:
    """Gemma3Processor's: the start of the image, its tokens and its end, between blank
    lines."""
    return ImagePrompt(start, f"\n\n{start}{image * tokens_per_image}{end}\n\n",
                       tokens_per_image)
