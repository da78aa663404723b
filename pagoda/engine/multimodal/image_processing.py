"""Decoded images into the pixels a vision tower reads, as each family's Hugging Face processor
makes them (the PIL path: transformers without torchvision, as here). An image becomes one or
more tiles of the tower's side, each a run of placeholders in the prompt, in that order.

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
is that tile alone, as transformers has it (mtmd would add the whole image beside it)."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch
from PIL import Image

from pagoda.engine.models.vision_tower import ImageTower, TileSettings


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


def image_processor(tower: ImageTower) -> Callable[[Image.Image], torch.Tensor]:
    """What makes a tower's pixels from an image, [tiles, 3, side, side]: Gemma 3's SigLIP
    takes one square, SmolVLM's tiles."""
    if tower.tiles is not None:
        return TiledResize(tower.image_size, tower.tiles)
    square = SquareResize(tower.image_size)
    return lambda image: square(image).unsqueeze(0)
