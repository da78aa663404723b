"""Decoded images into the pixels a vision tower reads, as each family's Hugging Face processor
makes them (the PIL path: transformers without torchvision, as here).

A square tower (Gemma 3's SigLIP: 896 x 896): the RGB image resized to the side with PIL's
bilinear filter (its aspect ratio not kept), scaled to 0..1, then normalised by the processor's
mean and standard deviation (0.5 each: -1..1)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch
from PIL import Image

from pagoda.engine.models.vision_tower import ImageTower


@dataclass(frozen=True, slots=True)
class SquareResize:
    side: int
    mean: tuple[float, float, float] = (0.5, 0.5, 0.5)
    std: tuple[float, float, float] = (0.5, 0.5, 0.5)

    def __call__(self, image: Image.Image) -> torch.Tensor:
        """An RGB image -> [3, side, side] float32 pixels."""
        resized = image.convert("RGB").resize((self.side, self.side), Image.Resampling.BILINEAR)
        pixels = torch.from_numpy(np.asarray(resized, dtype=np.float32) / np.float32(255.0))
        mean, std = torch.tensor(self.mean), torch.tensor(self.std)
        return ((pixels - mean) / std).permute(2, 0, 1).contiguous()


def image_processor(tower: ImageTower) -> Callable[[Image.Image], torch.Tensor]:
    """What makes a tower's pixels from an image: Gemma 3's SigLIP takes a square."""
    return SquareResize(tower.image_size)
