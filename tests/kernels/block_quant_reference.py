"""What q4_gemv's and q8_gemv's activation quantizers (pagoda/kernels/cpu/block_quant.h) must give,
written in torch: for both kernels' tests."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
import torch


@dataclass(frozen=True)
class Width:
    """Activations quantized per block of 32 to this integer type, max |x| mapped to levels."""

    dtype: torch.dtype
    levels: int


WIDTHS = pytest.mark.parametrize("width", [Width(torch.int8, 127), Width(torch.int16, 32767)],
                                 ids=["int8", "int16"])


def activations(m: int, k: int, seed: int = 1) -> torch.Tensor:
    """Normal rows with a few channels 20x larger, and one all-zero block (scale 0)."""
    torch.manual_seed(seed)
    x = torch.randn(m, k)
    x[:, :4] *= 20
    x[:, 32:64] = 0
    return x


def runnable(kernel, isa: int) -> int:
    """isa, or the test skipped where this CPU lacks it (kernel: a Q4Gemv or a Q8Gemv)."""
    if not kernel.isa_supported(isa):
        pytest.skip(f"this CPU cannot run instruction set {isa} (so that path is untested here)")
    return isa


def quantize(kernel, width: Width, x: torch.Tensor, isa: int = -1):
    """kernel: a Q4Gemv or a Q8Gemv; its quantize_rows or quantize_rows16 by width."""
    fn = kernel.quantize_rows if width.dtype == torch.int8 else kernel.quantize_rows16
    return fn(x, isa)


def assert_torchs_rounding(x: torch.Tensor, width: Width, xq: torch.Tensor,
                           scale: torch.Tensor, total: torch.Tensor) -> None:
    """Each block's scale is max |x| / levels, x / scale rounded to nearest even (0 for an
    all-zero block), and the sum the rounded block's: so the min term sees the x that the
    products see."""
    m, k = x.shape
    blocks = x.view(m, k // 32, 32)
    want_scale = blocks.abs().amax(-1) / width.levels
    safe = torch.where(want_scale == 0, torch.ones_like(want_scale), want_scale)
    want_q = torch.where(want_scale.unsqueeze(-1) == 0, 0.0,
                         torch.round(blocks / safe.unsqueeze(-1)))
    assert torch.equal(scale, want_scale)
    assert torch.equal(xq.view(m, k // 32, 32), want_q.to(width.dtype))
    assert torch.equal(total, scale * xq.view(m, k // 32, 32).sum(-1).float())
