"""A SigLIP vision transformer (Gemma 3's and SmolVLM's image towers): an image's patches
embedded by one matmul, a learned position per patch, pre-norm encoder layers of bidirectional
multi-head attention and a GELU (tanh) MLP, a final LayerNorm. Its output is one vector per
patch, row by row, which a family's projector turns into the language model's image tokens.

Every patch attends to every other, so an image is encoded whole, apart from the paged KV
cache: the encoder runs once per image in the prefill that reaches the image's tokens.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from pagoda.engine.layers.linear import Linear


@dataclass(frozen=True, slots=True)
class VisionShape:
    image_size: int  # the side of the square image the position table covers, in pixels
    patch_size: int
    hidden_size: int
    num_heads: int
    layer_norm_eps: float
    channels: int = 3

    @property
    def patches_per_side(self) -> int:
        return self.image_size // self.patch_size

    @property
    def num_patches(self) -> int:
        return self.patches_per_side ** 2

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_heads


@dataclass(slots=True)
class Norm:
    """A LayerNorm's weight and bias."""

    weight: torch.Tensor
    bias: torch.Tensor

    def __call__(self, x: torch.Tensor, eps: float) -> torch.Tensor:
        return F.layer_norm(x, (x.shape[-1],), self.weight, self.bias, eps)


@dataclass(slots=True)
class VisionEncoderLayer:
    norm1: Norm
    qkv_proj: Linear  # q, k and v side by side, with their biases
    out_proj: Linear
    norm2: Norm
    fc1: Linear
    fc2: Linear


@dataclass(slots=True)
class VisionEncoder:
    shape: VisionShape
    patch_embedding: Linear  # [hidden, channels x patch x patch]: the conv's kernel, flattened
    positions: torch.Tensor  # [num_patches, hidden]
    layers: list[VisionEncoderLayer]
    post_norm: Norm

    def __call__(self, pixels: torch.Tensor) -> torch.Tensor:
        """[images, channels, side, side] normalised pixels -> [images, patches, hidden]."""
        s = self.shape
        images = pixels.shape[0]
        if tuple(pixels.shape[1:]) != (s.channels, s.image_size, s.image_size):
            raise ValueError(f"the encoder takes [images, {s.channels}, {s.image_size}, "
                             f"{s.image_size}] pixels, got {list(pixels.shape)}")
        pixels = pixels.to(self.positions.dtype)
        x = self.patch_embedding(patches_of(pixels, s.patch_size).flatten(0, 1))
        x = x.view(images, s.num_patches, s.hidden_size) + self.positions
        for layer in self.layers:
            x = x + self._attention(layer, layer.norm1(x, s.layer_norm_eps))
            h = layer.fc1(layer.norm2(x, s.layer_norm_eps).flatten(0, 1))
            x = x + layer.fc2(F.gelu(h, approximate="tanh")).view_as(x)
        return self.post_norm(x, s.layer_norm_eps)

    def _attention(self, layer: VisionEncoderLayer, x: torch.Tensor) -> torch.Tensor:
        s = self.shape
        images, patches, _ = x.shape
        qkv = layer.qkv_proj(x.flatten(0, 1)).view(images, patches, 3, s.num_heads, s.head_dim)
        q, k, v = qkv.permute(2, 0, 3, 1, 4).unbind(0)  # each [images, heads, patches, dim]
        out = F.scaled_dot_product_attention(q, k, v)
        return layer.out_proj(out.transpose(1, 2).reshape(images * patches, -1)).view_as(x)


def patches_of(pixels: torch.Tensor, patch: int) -> torch.Tensor:
    """[images, channels, H, W] -> [images, patches, channels x patch x patch], patches row by
    row and each in the order a conv kernel of [channels, patch, patch] reads it."""
    images, channels, height, width = pixels.shape
    grid = pixels.reshape(images, channels, height // patch, patch, width // patch, patch)
    return grid.permute(0, 2, 4, 1, 3, 5).reshape(images, -1, channels * patch * patch)
