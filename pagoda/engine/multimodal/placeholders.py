"""A prompt's images matched to their placeholders: each image is one run of the model's image
token per piece the processor makes of it (Gemma 3 and Qwen2.5-VL: one, SmolVLM: a tile each of
its grid and the whole image), each as long as the model gives that piece (Gemma 3: 256; SmolVLM:
its tile's; Qwen2.5-VL: one per merge unit of its patches, so as its size), in the order the
images and their pieces come. Each piece is an ImageSpan of its own: encoded on its own, and the
prefix cache may end between two.

In a chat, an image part becomes the model's marker in the text the template renders
(`ImagePrompt.marker`: what each family's own template writes for an image part: Gemma 3's
`<start_of_image>`, SmolVLM's `<image>`, Qwen2.5-VL's
`<|vision_start|><|image_pad|><|vision_end|>`), and each marker becomes its image's whole layout
before the text is tokenized (`ImagePrompt.expand`, from each image's size), as the family's
Hugging Face processor does."""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from PIL import Image

from pagoda.engine.core.image_spans import ImageSpan
from pagoda.engine.errors import ImageInputError
from pagoda.engine.models.vision_tower import GridImageTower, ImageTower
from pagoda.engine.multimodal.image_processing import ProcessedImage, grid_resize, tile_grid
from pagoda.engine.multimodal.images import DecodedImage

# A token of the model's own vocabulary in a layout's text (<image>, <row_1_col_2>,
# <|vision_end|>): one token each.
_MODEL_TOKEN = re.compile(r"<[^<>\s]+>")


def image_spans(token_ids: Sequence[int], images: Sequence[DecodedImage], image_token_id: int,
                processor: Callable[[Image.Image], ProcessedImage],
                whole: bool = True) -> tuple[ImageSpan, ...]:
    """Each piece's span of placeholders with its processed pixels; ImageInputError where the
    prompt's runs of the image token do not fit the images given. whole: each piece's tokens
    are prefilled in one chunk (the language model attends both ways within an image)."""
    runs = _runs(token_ids, image_token_id)
    processed = [processor(image.image) for image in images]
    counts = [len(p.pixels) for p in processed]
    if len(runs) != sum(counts):
        raise ImageInputError(_count_mismatch(len(runs), counts))
    tiled = any(n > 1 for n in counts)
    pieces = [(f"{image.content_hash}:{k}" if len(p.pixels) > 1 else image.content_hash,
               pixels, p, image)
              for image, p in zip(images, processed, strict=True)
              for k, pixels in enumerate(p.pixels)]
    spans = []
    for i, ((offset, length), (content_hash, pixels, p, image)) in enumerate(
            zip(runs, pieces, strict=True)):
        if length != p.tokens:
            raise ImageInputError(
                f"{'tile' if tiled else 'image'} {i}'s placeholders at token {offset} are "
                f"{length} tokens, where this model gives {_each(tiled, p, image)} {p.tokens}")
        spans.append(ImageSpan(offset, length, content_hash, pixels, p.grid, whole))
    return tuple(spans)


def _each(tiled: bool, processed: ProcessedImage, image: DecodedImage) -> str:
    if tiled:
        return "each tile"
    if processed.grid is None:
        return "each image"
    return f"this {image.size[0]} x {image.size[1]} image"


def _count_mismatch(runs: int, pieces: list[int]) -> str:
    if all(n == 1 for n in pieces):
        return (f"the prompt holds placeholders for {runs} image(s) but {len(pieces)} image(s) "
                "came with it: each image needs its own run of image tokens")
    return (f"the prompt holds {runs} run(s) of image tokens but its {len(pieces)} image(s) "
            f"are {sum(pieces)} tiles ({', '.join(map(str, pieces))}): each tile needs its own "
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
    """marker: what a chat's image part is in the template's text; layout: what a marker becomes
    before tokenizing for an image of (width, height): its placeholders between the model's own
    text (Gemma 3: the same for every image; SmolVLM: its tile grid's; Qwen2.5-VL: as many as
    its merge units). tokens_per_image: every image's placeholders where the same whatever its
    size. exact: the layout is of the model's own tokens alone, so `tokens` is the tokenizer's
    count (where it holds text, such as blank lines, that may merge with its neighbours: about
    it)."""

    marker: str
    placeholder: str  # the image token
    layout: Callable[[tuple[int, int]], str]
    tokens_per_image: int | None = None
    exact: bool = False

    def expand(self, text: str, sizes: Sequence[tuple[int, int]]) -> str:
        """text's markers as the layouts of their images (sizes: the images' (width, height),
        in order); ImageInputError where the markers and the images are not as many."""
        first, *rest = text.split(self.marker)
        if len(rest) != len(sizes):
            raise ImageInputError(f"the prompt holds {len(rest)} image marker(s) "
                                  f"({self.marker}) but {len(sizes)} image(s) came with it")
        return first + "".join(self.layout(size) + piece
                               for size, piece in zip(sizes, rest, strict=True))

    def tokens(self, size: tuple[int, int]) -> int:
        """The tokens an image of size (width, height) takes in the prompt: its placeholders and
        the model's tokens around them, and one for each run of line breaks among them."""
        layout = self.layout(size)
        return len(_MODEL_TOKEN.findall(layout)) + len(re.findall(r"\n+", layout))


def tower_image_prompt(tower: ImageTower | GridImageTower, start: str, image: str,
                       end: str) -> ImagePrompt:
    """The family's ImagePrompt for its tower (start, image, end: the tower's image tokens as
    the vocabulary spells them), as `image_processor` picks its pixels."""
    if isinstance(tower, GridImageTower):
        return qwen2_5_vl_image_prompt(start, image, end, grid_resize(tower).tokens)
    if tower.tiles is not None:
        tiles = tower.tiles
        return smolvlm_image_prompt(SmolVLMTokens(), tower.tokens_per_image,
                                    lambda size: tile_grid(size, tower.image_size, tiles))
    return gemma3_image_prompt(start, image, end, tower.tokens_per_image)


def gemma3_image_prompt(start: str, image: str, end: str,
                        tokens_per_image: int) -> ImagePrompt:
    """Gemma3Processor's: the start of the image, its tokens and its end, between blank
    lines."""
    expansion = f"\n\n{start}{image * tokens_per_image}{end}\n\n"
    return ImagePrompt(start, image, lambda _size: expansion, tokens_per_image)


def qwen2_5_vl_image_prompt(start: str, image: str, end: str,
                            tokens_of: Callable[[int, int], int]) -> ImagePrompt:
    """Qwen's template writes an image part as its start, one placeholder and its end; its
    processor repeats the placeholder once per token of the image (tokens_of its width and
    height)."""
    return ImagePrompt(start + image + end, image,
                       lambda size: start + image * tokens_of(*size) + end, exact=True)


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

    return ImagePrompt(tokens.image, tokens.image, layout)
