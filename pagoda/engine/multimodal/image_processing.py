"""Decoded images into the pixels a vision tower reads, as each family's Hugging Face processor
makes them (the PIL path: transformers without torchvision, as here).

A square tower (Gemma 3's SigLIP: 896 x 896): the RGB image resized to the side with PIL's
bilinear filter (its aspect ratio not kept), scaled to 0..1, then normalised by the processor's
mean and standard deviation (0.5 each: -1..1).

A grid tower (Qwen2.5-VL's): the image resized with PIL's bicubic filter to the nearest sides
that are whole merge units (28 pixels: 2 x 2 patches of 14), its area brought within
min_pixels..max_pixels keeping its aspect ratio (Qwen's "smart resize"), normalised by CLIP's
mean and standard deviation, then cut into patches merge unit by merge unit, each patch's
pixels twice (two frames of a still image). The image's tokens are its merge units: their
count follows its size. The size is computed before any pixel is: max_pixels bounds what is
allocated whatever the image."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch
from PIL import Image

from pagoda.engine.errors import ImageInputError
from pagoda.engine.layers.grid_vision_encoder import PatchGrid
from pagoda.engine.models.vision_tower import CLIP_MEAN, CLIP_STD, GridImageTower, ImageTower

# Qwen's processor refuses images longer than this many times their width, or wider.
MAX_ASPECT_RATIO = 200


@dataclass(frozen=True, slots=True)
class ProcessedImage:
    """What the tower reads of an image, and its placeholders: how many, and where the
    language model places them on a grid (rows, columns: M-RoPE), or None (a sequence)."""

    pixels: object  # a tensor (square towers) or a PatchGrid
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
        return _normalised(resized, self.mean, self.std)


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
        pixels = _normalised(resized, self.mean, self.std)  # [3, height, width]
        p, m = self.patch_size, self.merge_size
        rows, columns = height // p, width // p
        grid = pixels.view(3, rows // m, m, p, columns // m, m, p).permute(1, 4, 2, 5, 0, 3, 6)
        frames = grid.unsqueeze(5).expand(*grid.shape[:5], self.temporal_patch_size,
                                          *grid.shape[5:])
        return PatchGrid(frames.reshape(rows * columns, -1).contiguous(), rows, columns)

    def process(self, image: Image.Image) -> ProcessedImage:
        grid = self(image)
        m = self.merge_size
        return ProcessedImage(grid, grid.rows * grid.columns // m ** 2,
                              (grid.rows // m, grid.columns // m))


def grid_resize(tower: GridImageTower) -> GridResize:
    s = tower.encoder.shape
    return GridResize(s.patch_size, s.merge_size, s.temporal_patch_size, tower.min_pixels,
                      tower.max_pixels)


def image_processor(tower: ImageTower | GridImageTower) -> Callable[[Image.Image],
                                                                     ProcessedImage]:
    """What makes a tower's pixels from an image: Gemma 3's SigLIP takes a square, Qwen2.5-VL's
    tower a grid of the image's own proportions."""
    if isinstance(tower, GridImageTower):
        return grid_resize(tower).process
    square = SquareResize(tower.image_size)
    return lambda image: ProcessedImage(square(image), tower.tokens_per_image)


def _normalised(image: Image.Image, mean: tuple[float, float, float],
                std: tuple[float, float, float]) -> torch.Tensor:
    """RGB pixels scaled to 0..1 and normalised -> [3, height, width] float32."""
    pixels = torch.from_numpy(np.asarray(image, dtype=np.float32) / np.float32(255.0))
    return ((pixels - torch.tensor(mean)) / torch.tensor(std)).permute(2, 0, 1).contiguous()
