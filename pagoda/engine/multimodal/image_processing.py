"""Decoded images into the pixels a vision tower reads, as each family's Hugging Face processor
makes them (the PIL path: transformers without torchvision, as here). An image becomes one or
more pieces (SmolVLM's tiles of the tower's side), each a run of placeholders in the prompt, in
that order (`ProcessedImage`).

A square tower (Gemma 3's SigLIP: 896 x 896): the RGB image resized to the side with PIL's
bilinear filter (its aspect ratio not kept), scaled to 0..1, then normalised by the processor's
mean and standard deviation (0.5 each: -1..1).

SmolVLM's tiles (`TiledResize`): the image's longest edge resized to the processor's
longest_edge (aspect kept, the other edge made even), then each edge rounded up to whole tiles,
cut into rows x cols tiles, row by row, and the whole image shrunk to one tile after them. Every
resize is PIL's Lanczos on 8-bit pixels, as SmolVLMImageProcessorPil does. llama.cpp's mtmd
splits an idefics3 mmproj's images the same way (its longest edge: the file's
clip.vision.preproc_image_size), so one processor serves the folder and the GGUF file. An image
that is one tile or less after the resize (a processor whose longest edge is the tower's side)
is that tile alone, as transformers has it (mtmd would add the whole image beside it).

A grid tower (Qwen2.5-VL's): the image resized with PIL's bicubic filter to the nearest sides
that are whole merge units (28 pixels: 2 x 2 patches of 14), its area brought within
min_pixels..max_pixels keeping its aspect ratio (Qwen's "smart resize"), normalised by CLIP's
mean and standard deviation, then cut into patches merge unit by merge unit, each patch's
pixels twice (two frames of a still image). The image's tokens are its merge units: their
count follows its size. The size is computed before any pixel is: max_pixels bounds what is
allocated whatever the image."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import torch
from PIL import Image

from pagoda.engine.errors import ImageInputError
from pagoda.engine.layers.grid_vision_encoder import PatchGrid
from pagoda.engine.models.vision_tower import (
    CLIP_MEAN,
    CLIP_STD,
    GridImageTower,
    ImageTower,
    TileSettings,
)

# Qwen's processor refuses images longer than this many times their width, or wider.
MAX_ASPECT_RATIO = 200


@dataclass(frozen=True, slots=True)
class ProcessedImage:
    """What the tower reads of an image, piece by piece (Gemma 3's square and Qwen2.5-VL's grid:
    one piece; SmolVLM: a tile each), each piece a run of placeholders in the prompt: `tokens`
    long each, and where the language model places a run's tokens on a grid (rows, columns:
    Qwen2.5-VL's M-RoPE), or None (a sequence)."""

    pixels: Sequence[object]  # a piece's [3, side, side] tensor or PatchGrid each
    tokens: int
    grid: tuple[int, int] | None = None


@dataclass(frozen=True, slots=True)
class SquareResize:
    side: int
    mean: tuple[float, float, float] = (0.5, 0.5, 0.5)
    std: tuple[float, float, float] = (0.5, 0.5, 0.5)

    def __call__(self, image: Image.Image) -> torch.Tensor:
        """An RGB image -> [3, side, side] float32 pixels."""
        resized = image.convert("RGB").resize((self.side, self.side), Image.Resampling.BILINEAR)
        return normalized([resized], self.mean, self.std)[0]


@dataclass(frozen=True, slots=True)
class GridResize:
    patch_size: int
    merge_size: int
    temporal_patch_size: int
    min_pixels: int
    max_pixels: int
    mean: tuple[float, float, float] = CLIP_MEAN
    std: tuple[float, float, float] = CLIP_STD

    def size(self, width: int, height: int) -> tuple[int, int]:
        """(width, height) the image is resized to: whole merge units a side, its area within
        the bounds, its aspect ratio about kept."""
        if max(width, height) > MAX_ASPECT_RATIO * min(width, height):
            raise ImageInputError(f"the image is {width} x {height} pixels: this model reads "
                                  f"images at most {MAX_ASPECT_RATIO} times longer than wide")
        unit = self.patch_size * self.merge_size
        h, w = round(height / unit) * unit, round(width / unit) * unit
        if h * w > self.max_pixels:
            scale = math.sqrt(height * width / self.max_pixels)
            h = max(unit, math.floor(height / scale / unit) * unit)
            w = max(unit, math.floor(width / scale / unit) * unit)
        elif h * w < self.min_pixels:
            scale = math.sqrt(self.min_pixels / (height * width))
            h, w = math.ceil(height * scale / unit) * unit, math.ceil(width * scale / unit) * unit
        return w, h

    def tokens(self, width: int, height: int) -> int:
        """The image tokens of an image of this size (its merge units)."""
        width, height = self.size(width, height)
        unit = self.patch_size * self.merge_size
        return (width // unit) * (height // unit)

    def __call__(self, image: Image.Image) -> PatchGrid:
        width, height = self.size(*image.size)
        resized = image.convert("RGB").resize((width, height), Image.Resampling.BICUBIC)
        pixels = normalized([resized], self.mean, self.std)[0]  # [3, height, width]
        p, m = self.patch_size, self.merge_size
        rows, columns = height // p, width // p
        grid = pixels.view(3, rows // m, m, p, columns // m, m, p).permute(1, 4, 2, 5, 0, 3, 6)
        frames = grid.unsqueeze(5).expand(*grid.shape[:5], self.temporal_patch_size,
                                          *grid.shape[5:])
        return PatchGrid(frames.reshape(rows * columns, -1).contiguous(), rows, columns)

    def process(self, image: Image.Image) -> ProcessedImage:
        grid = self(image)
        m = self.merge_size
        return ProcessedImage((grid,), grid.rows * grid.columns // m ** 2,
                              (grid.rows // m, grid.columns // m))


def grid_resize(tower: GridImageTower) -> GridResize:
    s = tower.encoder.shape
    return GridResize(s.patch_size, s.merge_size, s.temporal_patch_size, tower.min_pixels,
                      tower.max_pixels)


@dataclass(frozen=True, slots=True)
class TiledResize:
    side: int  # the tower's
    settings: TileSettings

    def __call__(self, image: Image.Image) -> torch.Tensor:
        """An RGB image -> [tiles, 3, side, side] float32 pixels: rows x cols tiles then the
        whole image, or the whole image alone."""
        s, side = self.settings, self.side
        rgb = image.convert("RGB")
        resized = self._resize(rgb, longest_edge_size(rgb.size, s.longest_edge))
        if not s.split:
            tiles = [self._resize(resized, (side, side))]
        else:
            rows, cols = tile_grid(image.size, side, s)
            refined = self._resize(resized, (max(cols, 1) * side, max(rows, 1) * side))
            tiles = [refined.crop((c * side, r * side, (c + 1) * side, (r + 1) * side))
                     for r in range(rows) for c in range(cols)]
            tiles.append(self._resize(refined, (side, side)) if tiles else refined)
        return normalized(tiles, s.mean, s.std)

    def _resize(self, image: Image.Image, size: tuple[int, int]) -> Image.Image:
        return image.resize(size, Image.Resampling(self.settings.resample))


def longest_edge_size(size: tuple[int, int], longest_edge: int) -> tuple[int, int]:
    """(width, height) with the longest edge at longest_edge, the other kept in proportion
    (truncated, then made even; at least 1), as SmolVLM's processor computes it."""
    width, height = size
    if width >= height:
        return longest_edge, max(_even(int(longest_edge / (width / height))), 1)
    return max(_even(int(longest_edge * (width / height))), 1), longest_edge


def tile_grid(size: tuple[int, int], side: int, settings: TileSettings) -> tuple[int, int]:
    """(rows, cols) of the tiles an image of size (width, height) is cut into; (0, 0) where it
    is the whole image alone. At most (longest_edge / side) a way: the tiles' count is bounded
    by the processor's settings, whatever the image's size."""
    if not settings.split:
        return 0, 0
    width, height = longest_edge_size(size, settings.longest_edge)
    # The processor rounds the longest edge up to whole tiles, then the other edge as the
    # rounded one's proportion (truncated) rounded up.
    aspect = width / height
    if width >= height:
        width = math.ceil(width / side) * side
        height = math.ceil(int(width / aspect) / side) * side
    else:
        height = math.ceil(height / side) * side
        width = math.ceil(int(height * aspect) / side) * side
    if width <= side and height <= side:
        return 0, 0
    return height // side, width // side


def _even(n: int) -> int:
    return n + n % 2


def normalized(images: list[Image.Image], mean: tuple[float, float, float],
               std: tuple[float, float, float]) -> torch.Tensor:
    """RGB images of one size -> [images, 3, H, W] float32: scaled to 0..1, less mean, over
    std, as the processors compute it. In NumPy, channels first, into one array: PyTorch's
    broadcasting over a last dimension of 3, and a fresh tensor per tile, made 13 tiles of 512
    take 0.6 s against 0.05."""
    channels = np.stack([np.asarray(image) for image in images]).transpose(0, 3, 1, 2)
    pixels = channels.astype(np.float32, order="C")  # the copy lays the channels first
    pixels /= np.float32(255.0)
    pixels -= np.asarray(mean, dtype=np.float32)[:, None, None]
    pixels /= np.asarray(std, dtype=np.float32)[:, None, None]
    return torch.from_numpy(pixels)


def image_processor(tower: ImageTower | GridImageTower) -> Callable[[Image.Image],
                                                                     ProcessedImage]:
    """What makes a tower's pixels from an image: Gemma 3's SigLIP takes one square, SmolVLM's
    tiles of its side, Qwen2.5-VL's tower a grid of the image's own proportions."""
    if isinstance(tower, GridImageTower):
        return grid_resize(tower).process
    if tower.tiles is not None:
        tiled = TiledResize(tower.image_size, tower.tiles)
        return lambda image: ProcessedImage(tiled(image), tower.tokens_per_image)
    square = SquareResize(tower.image_size)
    return lambda image: ProcessedImage(square(image).unsqueeze(0), tower.tokens_per_image)
