"""A prompt's images matched to their placeholders: each image is one run of the model's image
token, as long as the model gives that image (Gemma 3: 256 each; Qwen2.5-VL: one per merge unit
of its patches, so as its size), in the order the images come.

In a chat, an image part becomes the model's marker in the text the template renders
(`ImagePrompt.marker`: Gemma 3's `<start_of_image>`, Qwen2.5-VL's
`<|vision_start|><|image_pad|><|vision_end|>`, what each one's own template writes for an image
part), and each marker becomes its image's whole run before the text is tokenized (`expand`), as
the family's Hugging Face processor does."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from PIL import Image

from pagoda.engine.core.image_spans import ImageSpan
from pagoda.engine.errors import ImageInputError
from pagoda.engine.multimodal.image_processing import ProcessedImage
from pagoda.engine.multimodal.images import DecodedImage


def image_spans(token_ids: Sequence[int], images: Sequence[DecodedImage], image_token_id: int,
                processor: Callable[[Image.Image], ProcessedImage],
                whole: bool = True) -> tuple[ImageSpan, ...]:
    """Each image's span of placeholders with its processed pixels; ImageInputError where the
    prompt's runs of the image token do not fit the images given. whole: each image's tokens
    are prefilled in one chunk (the language model attends both ways within an image)."""
    runs = _runs(token_ids, image_token_id)
    if len(runs) != len(images):
        raise ImageInputError(
            f"the prompt holds placeholders for {len(runs)} image(s) but {len(images)} "
            "image(s) came with it: each image needs its own run of image tokens")
    spans = []
    for i, ((offset, length), image) in enumerate(zip(runs, images, strict=True)):
        processed = processor(image.image)
        if length != processed.tokens:
            each = ("each image" if processed.grid is None
                    else f"this {image.size[0]} x {image.size[1]} image")
            raise ImageInputError(
                f"image {i}'s placeholders at token {offset} are {length} tokens, where this "
                f"model gives {each} {processed.tokens}")
        spans.append(ImageSpan(offset, length, image.content_hash, processed.pixels,
                               processed.grid, whole))
    return tuple(spans)


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
    """marker: what a chat's image part is in the template's text; each marker becomes, before
    tokenizing, its image's placeholders between the model's own text (`expand`): as many as
    tokens_per_image, or where that is None (Qwen2.5-VL) as `tokens_of` the image's width and
    height."""

    marker: str
    before: str  # the text before an image's placeholders
    placeholder: str
    after: str
    tokens_per_image: int | None
    tokens_of: Callable[[int, int], int] | None = None

    def tokens(self, width: int, height: int) -> int:
        """An image's placeholders."""
        if self.tokens_per_image is not None:
            return self.tokens_per_image
        return self.tokens_of(width, height)

    def expand(self, text: str, sizes: Sequence[tuple[int, int]] = ()) -> str:
        """The text with each marker in turn replaced by the placeholders of the image of that
        size (width, height), in order; ImageInputError where the markers and the sizes are not
        as many."""
        parts = text.split(self.marker)
        if self.tokens_per_image is None and len(parts) - 1 != len(sizes):
            raise ImageInputError(f"the chat's text holds {len(parts) - 1} image(s) but "
                                  f"{len(sizes)} came with it")
        sizes = sizes if self.tokens_per_image is None else [(0, 0)] * (len(parts) - 1)
        return parts[0] + "".join(self._expansion(*size) + part
                                  for size, part in zip(sizes, parts[1:], strict=True))

    def _expansion(self, width: int, height: int) -> str:
        return self.before + self.placeholder * self.tokens(width, height) + self.after


def gemma3_image_prompt(start: str, image: str, end: str,
                        tokens_per_image: int) -> ImagePrompt:
    """Gemma3Processor's: the start of the image, its tokens and its end, between blank
    lines."""
    return ImagePrompt(start, f"\n\n{start}", image, f"{end}\n\n", tokens_per_image)


def qwen2_5_vl_image_prompt(start: str, image: str, end: str,
                            tokens_of: Callable[[int, int], int]) -> ImagePrompt:
    """Qwen's template writes an image part as its start, one placeholder and its end; its
    processor repeats the placeholder once per token of the image."""
    return ImagePrompt(start + image + end, start, image, end, None, tokens_of)
