"""A prompt's images matched to their placeholders: each image is one run of the model's image
token per tile (Gemma 3: one, SmolVLM: its grid's and the whole image's), each as long as the
model gives a tile (Gemma 3: 256), in the order the images and their tiles come. Each tile is
an ImageSpan of its own: encoded on its own, and the prefix cache may end between two.

In a chat, an image part becomes the model's marker in the text the template renders
(`ImagePrompt.marker`: Gemma 3's `<start_of_image>`, which its own template writes for an image
part), and each marker becomes the whole run before the text is tokenized (`expand`), as the
family's Hugging Face processor does. SmolVLM's runs depend on the image's size (its tile
grid), so its expansion is made per image (`ImagePrompt.layout`)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from PIL import Image

from pagoda.engine.core.image_spans import ImageSpan
from pagoda.engine.errors import ImageInputError
from pagoda.engine.multimodal.images import DecodedImage


def image_spans(token_ids: Sequence[int], images: Sequence[DecodedImage], image_token_id: int,
                tokens_per_image: int,
                processor: Callable[[Image.Image], torch.Tensor]) -> tuple[ImageSpan, ...]:
    """Each tile's span of placeholders with its processed pixels (processor: an image ->
    [tiles, 3, side, side]); ImageInputError where the prompt's runs of the image token do not
    fit the images given."""
    runs = _runs(token_ids, image_token_id)
    tiles = [processor(image.image) for image in images]
    if len(runs) != sum(len(t) for t in tiles):
        raise ImageInputError(_count_mismatch(len(runs), [len(t) for t in tiles]))
    tiled = any(len(t) > 1 for t in tiles)
    for i, (offset, length) in enumerate(runs):
        if length != tokens_per_image:
            what = f"tile {i}'s" if tiled else f"image {i}'s"
            raise ImageInputError(
                f"{what} placeholders at token {offset} are {length} tokens, where this "
                f"model gives each {'tile' if tiled else 'image'} {tokens_per_image}")
    pieces = [(f"{image.content_hash}:{k}" if len(image_tiles) > 1 else image.content_hash,
               tile) for image, image_tiles in zip(images, tiles, strict=True)
              for k, tile in enumerate(image_tiles)]
    return tuple(ImageSpan(offset, length, content_hash, pixels)
                 for (offset, length), (content_hash, pixels) in zip(runs, pieces, strict=True))


def _count_mismatch(runs: int, tiles: list[int]) -> str:
    if all(n == 1 for n in tiles):
        return (f"the prompt holds placeholders for {runs} image(s) but {len(tiles)} image(s) "
                "came with it: each image needs its own run of image tokens")
    return (f"the prompt holds {runs} run(s) of image tokens but its {len(tiles)} image(s) "
            f"are {sum(tiles)} tiles ({', '.join(map(str, tiles))}): each tile needs its own "
            "run, as the model's processor lays an image out for its size")


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
    becomes before tokenizing (its image's placeholders between the model's own tokens);
    layout: where that depends on the image's (width, height), what it becomes for one
    (SmolVLM's tile grid), expansion then being the image's smallest."""

    marker: str
    expansion: str
    tokens_per_image: int  # the placeholders in an expansion (SmolVLM: in a tile's run)
    layout: Callable[[tuple[int, int]], str] | None = None

    def expand(self, text: str, sizes: Sequence[tuple[int, int]] = ()) -> str:
        """text's markers as their images' placeholders (sizes: the images', in order; only a
        layout reads them)."""
        if self.layout is None:
            return text.replace(self.marker, self.expansion)
        first, *rest = text.split(self.marker)
        if len(rest) != len(sizes):
            raise ImageInputError(f"the prompt holds {len(rest)} image marker(s) "
                                  f"({self.marker}) but {len(sizes)} image(s) came with it")
        return first + "".join(self.layout(size) + piece
                               for size, piece in zip(sizes, rest, strict=True))

    def placeholders(self, size: tuple[int, int]) -> int:
        """The placeholders an image of size (width, height) takes: all its tiles' (a layout's
        marker is the placeholder itself)."""
        if self.layout is None:
            return self.tokens_per_image
        return self.layout(size).count(self.marker)


def gemma3_image_prompt(start: str, image: str, end: str, tokens_per_image: int) -> ImagePrompt:
    """Gemma3Processor's: the start of the image, its tokens and its end, between blank
    lines."""
    return ImagePrompt(start, f"\n\n{start}{image * tokens_per_image}{end}\n\n",
                       tokens_per_image)


@dataclass(frozen=True, slots=True)
class SmolVLMTokens:
    """SmolVLM's processor's image tokens: around each tile (fake_token_around_image), the whole
    image's tag (global-img), the placeholder (image)."""

    around: str = "<fake_token_around_image>"
    whole: str = "<global-img>"
    image: str = "<image>"


def smolvlm_image_prompt(tokens: SmolVLMTokens, tokens_per_tile: int,
                         grid: Callable[[tuple[int, int]], tuple[int, int]]) -> ImagePrompt:
    """SmolVLMProcessor's: each tile its grid place and its placeholders, a line a row, then
    the whole image between blank lines; an image of one tile the whole image alone. grid: an
    image's (rows, cols) from its size ((0, 0): not split). The marker is the placeholder
    itself, as the model's chat template writes an image part."""
    run = tokens.image * tokens_per_tile
    single = f"{tokens.around}{tokens.whole}{run}{tokens.around}"

    def layout(size: tuple[int, int]) -> str:
        rows, cols = grid(size)
        if rows == cols == 0:
            return single
        lines = "".join("".join(f"{tokens.around}<row_{r}_col_{c}>{run}"
                                for c in range(1, cols + 1)) + "\n"
                        for r in range(1, rows + 1))
        return f"{lines}\n{single}"

    return ImagePrompt(tokens.image, single, tokens_per_tile, layout)
