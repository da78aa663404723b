"""A prompt's images matched to their placeholders: each image is one run of the model's image
token, as long as the model gives an image (Gemma 3: 256), in the order the images come."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
from PIL import Image

from pagoda.engine.core.image_spans import ImageSpan
from pagoda.engine.errors import ImageInputError
from pagoda.engine.multimodal.images import DecodedImage


def image_spans(token_ids: Sequence[int], images: Sequence[DecodedImage], image_token_id: int,
                tokens_per_image: int,
                processor: Callable[[Image.Image], torch.Tensor]) -> tuple[ImageSpan, ...]:
    """Each image's span of placeholders with its processed pixels; ImageInputError where the
    prompt's runs of the image token do not fit the images given."""
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
    return tuple(ImageSpan(offset, length, image.content_hash, processor(image.image))
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
