"""What turns a vision tower's patch vectors into a language model's image tokens.

Gemma 3's (`PooledProjector`): the patches' grid average-pooled to mm_tokens_per_image (a 64 x 64
grid of an 896-pixel image into 16 x 16: 256 tokens), each RMS-normalised (Gemma's 1 + w) and
projected to the language model's width.

SmolVLM's (`PixelShuffleProjector`): each square of scale x scale patches folded into one token
(their vectors side by side, row by row: a 32 x 32 grid of a 512-pixel tile into 16 x 16 tokens
four times as wide, at scale 4), projected to the language model's width by one matrix.

Qwen2.5-VL's (`PatchMerger`): each merge unit's patches (2 x 2, consecutive in the processor's
order) RMS-normalised one by one, side by side, through a GELU MLP to the language model's
width: one image token per unit."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from pagoda.engine.layers.linear import Linear


@dataclass(slots=True)
class PooledProjector:
    patches_per_side: int
    tokens_per_side: int
    norm_weight: torch.Tensor  # w of the (1 + w) the norm scales by
    eps: float
    projection: Linear  # vision width -> text width

    @property
    def tokens_per_image(self) -> int:
        return self.tokens_per_side ** 2

    def __call__(self, patches: torch.Tensor) -> torch.Tensor:
        """[images, patches, vision width] -> [images, tokens_per_image, text width]."""
        images, _, width = patches.shape
        side = self.patches_per_side
        grid = patches.transpose(1, 2).reshape(images, width, side, side)
        kernel = side // self.tokens_per_side
        pooled = F.avg_pool2d(grid, kernel_size=kernel, stride=kernel).flatten(2).transpose(1, 2)
        x = pooled.float()
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * (1.0 + self.norm_weight)
        out = self.projection(x.to(patches.dtype).flatten(0, 1))
        return out.view(images, self.tokens_per_image, -1)


@dataclass(slots=True)
class PixelShuffleProjector:
    patches_per_side: int
    scale: int
    projection: Linear  # vision width x scale^2 -> text width, no bias

    @property
    def tokens_per_image(self) -> int:
        return (self.patches_per_side // self.scale) ** 2

    def __call__(self, patches: torch.Tensor) -> torch.Tensor:
        """[images, patches, vision width] -> [images, tokens_per_image, text width]."""
        images, _, width = patches.shape
        side, s = self.patches_per_side, self.scale
        grid = patches.reshape(images, side // s, s, side // s, s, width)
        # A token's vector: its square's patches row by row, each patch's vector whole.
        folded = grid.permute(0, 1, 3, 2, 4, 5).reshape(-1, s * s * width)
        return self.projection(folded.contiguous()).view(images, self.tokens_per_image, -1)


@dataclass(slots=True)
class PatchMerger:
    unit: int  # patches per merge unit
    norm_weight: torch.Tensor
    eps: float
    fc1: Linear  # unit x vision width -> the same
    fc2: Linear  # -> text width

    def __call__(self, patches: torch.Tensor) -> torch.Tensor:
        """[patches, vision width] in merge units -> [patches / unit, text width]."""
        x = patches.float()
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        x = self.norm_weight * x.to(patches.dtype)
        return self.fc2(F.gelu(self.fc1(x.reshape(-1, self.unit * x.shape[-1]))))
