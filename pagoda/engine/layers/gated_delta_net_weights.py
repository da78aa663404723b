"""Gated DeltaNet from a checkpoint's tensors, named as in Hugging Face's layers (the names after
`linear_attn.`), in either family's layout, normalized to the mixer's one projection
[q | k | v | z | b | a]:

- Qwen3.5: in_proj_qkv, in_proj_z, in_proj_b and in_proj_a, already in that order;
- Qwen3-Next: in_proj_qkvz and in_proj_ba, grouped by key head (each group holds its head's q,
  k, then its value heads' v and z; b and a alike), whose rows are reordered here;
- a qwen3next GGUF file: in_proj_qkv and in_proj_z (llama.cpp's converter splits in_proj_qkvz
  so), and in_proj_ba as the folder has it.

Both have conv1d.weight [channels, 1, kernel], A_log, dt_bias, norm.weight and out_proj.weight.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

import torch

from pagoda.engine.errors import ModelLoadError
from pagoda.engine.layers.gated_delta_net import DeltaNetShape, GatedDeltaNet
from pagoda.engine.layers.linear import Linear, Placement, make_fused_linear, make_linear
from pagoda.engine.quantization.tensors import Weight, select_rows

QWEN3_5_PROJECTIONS = ("in_proj_qkv", "in_proj_z", "in_proj_b", "in_proj_a")
QWEN3_NEXT_PROJECTIONS = ("in_proj_qkvz", "in_proj_ba")
QWEN3_NEXT_SPLIT_PROJECTIONS = ("in_proj_qkv", "in_proj_z", "in_proj_ba")
_SHARED = ("conv1d.weight", "A_log", "dt_bias", "norm.weight", "out_proj.weight")


def qwen3_5_gated_delta_net(tensors: Mapping[str, Weight], shape: DeltaNetShape, eps: float,
                            placement: Placement) -> GatedDeltaNet:
    _require(tensors, [f"{p}.weight" for p in QWEN3_5_PROJECTIONS])
    parts = [tensors[f"{p}.weight"] for p in QWEN3_5_PROJECTIONS]
    return _build(make_fused_linear(parts, None, placement), tensors, shape, eps, placement)


def qwen3_next_gated_delta_net(tensors: Mapping[str, Weight], shape: DeltaNetShape,
                               eps: float, placement: Placement) -> GatedDeltaNet:
    _require(tensors, [f"{p}.weight" for p in QWEN3_NEXT_PROJECTIONS])
    qkvz_order, ba_order = qwen3_next_row_orders(shape)
    parts = [select_rows(tensors["in_proj_qkvz.weight"], qkvz_order),
             select_rows(tensors["in_proj_ba.weight"], ba_order)]
    return _build(make_fused_linear(parts, None, placement), tensors, shape, eps, placement)


def qwen3_next_split_gated_delta_net(tensors: Mapping[str, Weight], shape: DeltaNetShape,
                                     eps: float, placement: Placement) -> GatedDeltaNet:
    _require(tensors, [f"{p}.weight" for p in QWEN3_NEXT_SPLIT_PROJECTIONS])
    _, ba_order = qwen3_next_row_orders(shape)
    parts = [tensors["in_proj_qkv.weight"], tensors["in_proj_z.weight"],
             select_rows(tensors["in_proj_ba.weight"], ba_order)]
    return _build(make_fused_linear(parts, None, placement), tensors, shape, eps, placement)


def qwen3_next_row_orders(shape: DeltaNetShape) -> tuple[torch.Tensor, torch.Tensor]:
    """The rows of in_proj_qkvz and in_proj_ba that give [q | k | v | z] and [b | a]."""
    s = shape
    group = s.num_v_heads // s.num_k_heads
    head = torch.arange(s.num_k_heads).unsqueeze(1)
    qkvz_sizes = (s.k_dim, s.k_dim, group * s.v_dim, group * s.v_dim)
    qkvz = _rows_by_part(head * sum(qkvz_sizes), qkvz_sizes)
    ba = _rows_by_part(head * 2 * group, (group, group))
    return qkvz, ba


def _rows_by_part(group_starts: torch.Tensor, sizes: tuple[int, ...]) -> torch.Tensor:
    """Each part's rows from every group in turn, the parts one after the other."""
    rows, offset = [], 0
    for size in sizes:
        rows.append((group_starts + offset + torch.arange(size)).flatten())
        offset += size
    return torch.cat(rows)


def _build(in_proj: Linear, tensors: Mapping[str, Weight], shape: DeltaNetShape, eps: float,
           placement: Placement) -> GatedDeltaNet:
    _require(tensors, _SHARED)
    device, dtype = placement.device, placement.dtype
    conv = tensors["conv1d.weight"]
    if conv.shape != (shape.conv_channels, 1, shape.conv_kernel):
        raise ModelLoadError(f"Gated DeltaNet's conv1d.weight has shape {tuple(conv.shape)}, "
                             f"config.json implies {(shape.conv_channels, 1, shape.conv_kernel)}")
    return GatedDeltaNet(
        in_proj=in_proj,
        conv_weight=conv[:, 0].to(device, dtype),
        decay_rate=tensors["A_log"].to(device, torch.float32).exp(),
        dt_bias=tensors["dt_bias"].to(device, torch.float32),
        norm_weight=tensors["norm.weight"].to(device, dtype),
        out_proj=make_linear(tensors["out_proj.weight"], None, placement),
        shape=shape, eps=eps)


def _require(tensors: Mapping[str, Weight], names: Iterable[str]) -> None:
    missing = [n for n in names if n not in tensors]
    if missing:
        raise ModelLoadError(f"This checkpoint's Gated DeltaNet layer lacks {', '.join(missing)}"
                             f" (it has {', '.join(sorted(tensors))}).")
