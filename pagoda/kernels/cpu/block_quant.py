"""The Python side of block_quant.h: activations quantized per block of 32, as q4_gemv's and
q8_gemv's `*_quantize_rows` entry points (one C quantizer behind both) return them."""

from __future__ import annotations

import ctypes

import torch

BLOCK = 32


def quantize_rows(fn: ctypes._CFuncPtr, dtype: torch.dtype, x: torch.Tensor, isa: int,
                  ) -> tuple[int, torch.Tensor, torch.Tensor, torch.Tensor]:
    """fn(isa, x, m, k, xq, xscale, xsum) on fp32 [m, k] x -> (its return code, xq [m, k] in
    dtype, scales and sums fp32 [m, k / 32])."""
    x = x.float().contiguous()
    m, k = x.shape
    xq = torch.empty(m, k, dtype=dtype)
    scale, total = torch.empty(m, k // BLOCK), torch.empty(m, k // BLOCK)
    rc = fn(isa, x.data_ptr(), m, k, xq.data_ptr(), scale.data_ptr(), total.data_ptr())
    return rc, xq, scale, total
