"""Qwen2.5-VL's vision transformer: an image of any size (a multiple of two patches a side) as
its grid of patches, each patch two frames of the same pixels (the kernel is a 3-D conv's over
time, and a still image is repeated), embedded by one matmul; attention rotated by each patch's
row and column (2-D RoPE: a quarter of the head's pairs turn by the row, the next quarter by the
column, the second half repeats them); pre-RMSNorm layers with a SwiGLU MLP.

Most layers attend within windows of window_size pixels (whole merge units of 2 x 2 patches,
tiled from the top left, the last row and column of windows cut short by the image's edge), the
layers of full_attention_layers over the whole image. The processor lays patches out merge unit
by merge unit (pagoda/engine/multimodal/image_processing.py); the encoder reorders the units
window by window so that each window's patches are contiguous, as transformers does (a
window's attention then is one block), and gives its output back in the processor's order.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from pagoda.engine.layers.linear import Linear


@dataclass(frozen=True, slots=True)
class GridVisionShape:
    patch_size: int
    temporal_patch_size: int
    merge_size: int  # merge units of merge_size x merge_size patches
    hidden_size: int
    num_heads: int
    window_size: int  # a window's side in pixels
    full_attention_layers: frozenset[int]
    norm_eps: float
    channels: int = 3

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_heads

    @property
    def patch_floats(self) -> int:
        return self.channels * self.temporal_patch_size * self.patch_size ** 2

    @property
    def window_units(self) -> int:
        """A window's side in merge units."""
        return max(1, self.window_size // self.patch_size // self.merge_size)


@dataclass(slots=True)
class GridVisionLayer:
    norm1: torch.Tensor
    qkv_proj: Linear  # q, k and v side by side, with their biases
    out_proj: Linear
    norm2: torch.Tensor
    gate_up_proj: Linear
    down_proj: Linear


@dataclass(frozen=True, slots=True)
class PatchGrid:
    """An image's patches as the processor lays them out, merge unit by merge unit: rows x
    columns patches of shape.patch_floats each."""

    patches: torch.Tensor  # [rows * columns, patch floats]
    rows: int
    columns: int


@dataclass(slots=True)
class GridVisionEncoder:
    shape: GridVisionShape
    patch_embedding: Linear  # [hidden, channels x frames x patch x patch]: the conv's kernel
    layers: list[GridVisionLayer]
    inverse_frequencies: torch.Tensor  # [head_dim / 4]: the 2-D RoPE's, float32

    def __call__(self, grid: PatchGrid) -> torch.Tensor:
        """One image's patches -> [patches, hidden], in the processor's order."""
        s = self.shape
        if grid.patches.shape != (grid.rows * grid.columns, s.patch_floats):
            raise ValueError(f"the encoder takes [{grid.rows * grid.columns}, {s.patch_floats}] "
                             f"patches, got {list(grid.patches.shape)}")
        order, window_lengths = window_order(grid.rows // s.merge_size,
                                             grid.columns // s.merge_size, s.window_units)
        unit = s.merge_size ** 2
        patch_order = (order.unsqueeze(1) * unit + torch.arange(unit)).flatten()
        pixels = grid.patches[patch_order.to(grid.patches.device)]
        x = self.patch_embedding(pixels.to(self.layers[0].norm1.dtype))
        cos, sin = self._rotary(grid, patch_order)
        windows = [n * unit for n in window_lengths]
        for i, layer in enumerate(self.layers):
            segments = [x.shape[0]] if i in s.full_attention_layers else windows
            h = _rms_norm(x, layer.norm1, s.norm_eps)
            x = x + layer.out_proj(self._attention(layer, h, cos, sin, segments))
            h = layer.gate_up_proj(_rms_norm(x, layer.norm2, s.norm_eps))
            gate, up = h.chunk(2, dim=-1)
            x = x + layer.down_proj(F.silu(gate) * up)
        return x[torch.argsort(patch_order).to(x.device)]

    def _rotary(self, grid: PatchGrid, patch_order: torch.Tensor
                ) -> tuple[torch.Tensor, torch.Tensor]:
        """cos and sin [patches, 1, head_dim] (float32) of each patch's row and column, in
        window order."""
        rows, columns = patch_positions(grid.rows, grid.columns, self.shape.merge_size)
        freq = self.inverse_frequencies
        angles = torch.cat((rows[patch_order, None].to(freq) * freq,
                            columns[patch_order, None].to(freq) * freq), dim=-1)
        angles = torch.cat((angles, angles), dim=-1).unsqueeze(1)
        return angles.cos(), angles.sin()

    def _attention(self, layer: GridVisionLayer, x: torch.Tensor, cos: torch.Tensor,
                   sin: torch.Tensor, segments: list[int]) -> torch.Tensor:
        s = self.shape
        qkv = layer.qkv_proj(x).view(x.shape[0], 3, s.num_heads, s.head_dim)
        q, k, v = qkv.unbind(1)  # each [patches, heads, dim]
        q, k = _rotate(q, cos, sin), _rotate(k, cos, sin)
        return attend_in_segments(q, k, v, segments).reshape(x.shape[0], -1)


def window_order(rows: int, columns: int, side: int) -> tuple[torch.Tensor, list[int]]:
    """The merge units of a rows x columns grid window by window (windows of side x side
    units from the top left, row by row; units row by row within each), and how many units
    each window holds."""
    y, x = torch.meshgrid(torch.arange(rows), torch.arange(columns), indexing="ij")
    across = -(-columns // side)
    window = (y // side) * across + x // side
    within = (y % side) * side + x % side
    order = torch.argsort((window * side * side + within).flatten())
    return order, torch.bincount(window.flatten()).tolist()


def patch_positions(rows: int, columns: int, merge: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Each patch's row and column, patches in the processor's order (merge unit by unit)."""
    y, x = torch.meshgrid(torch.arange(rows), torch.arange(columns), indexing="ij")
    blocks = (rows // merge, merge, columns // merge, merge)
    return (y.reshape(blocks).transpose(1, 2).flatten(),
            x.reshape(blocks).transpose(1, 2).flatten())


def attend_in_segments(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                       segments: list[int]) -> torch.Tensor:
    """Bidirectional attention within each contiguous segment of rows ([rows, heads, dim]
    each); segments of one length attend in one batched call."""
    out = torch.empty_like(q)
    starts: dict[int, list[int]] = {}
    first = 0
    for n in segments:
        starts.setdefault(n, []).append(first)
        first += n
    for n, firsts in starts.items():
        rows = (torch.tensor(firsts).unsqueeze(1) + torch.arange(n)).flatten().to(q.device)

        def batch(t: torch.Tensor) -> torch.Tensor:  # [segments, heads, n, dim]
            return t[rows].view(len(firsts), n, *t.shape[1:]).transpose(1, 2)

        attended = F.scaled_dot_product_attention(batch(q), batch(k), batch(v))
        out[rows] = attended.transpose(1, 2).reshape(-1, *q.shape[1:])
    return out


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """RoPE by halves, in float32 as transformers turns the tower's queries and keys."""
    half = x.shape[-1] // 2
    xf = x.float()
    turned = torch.cat((-xf[..., half:], xf[..., :half]), dim=-1)
    return (xf * cos + turned * sin).to(x.dtype)


def _rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    xf = x.float()
    normed = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return weight * normed.to(x.dtype)
