"""pagoda/kernels/cpu/q8_gemv.c multiplies grouped int8 weights, read in place, by activations
quantized per block to int8 or int16, exactly as the same math in torch (float64) to fp32
rounding, and with the same bits on every instruction set and thread count."""

import os
from dataclasses import dataclass

import pytest
import torch
from block_quant_reference import WIDTHS, activations, assert_torchs_rounding, quantize

from pagoda.engine.quantization.tensors import Int8Weight, dequantize, quantize_int8
from pagoda.kernels.cpu.native import find_compiler, mapped_openmp_runtimes, torch_openmp_runtime
from pagoda.kernels.cpu.q8_gemv import Q8Gemv, Q8Operand

SCALAR, AVX2, AVX512_VNNI = 0, 1, 2
ISAS = pytest.mark.parametrize("isa", [SCALAR, AVX2, AVX512_VNNI],
                               ids=["scalar", "avx2", "avx512-vnni"])
# Odd N leaves a partial tile of rows (tiles are 4 rows).
SHAPES = [(576, 963), (576, 5), (1536, 576), (64, 3)]


@dataclass(frozen=True)
class Layout:
    """How the weight stores its groups: fp16 or fp32 scales, with or without mins."""

    half: bool
    mins: bool


LAYOUTS = pytest.mark.parametrize("layout", [Layout(True, False), Layout(False, False),
                                             Layout(False, True), Layout(True, True)],
                                  ids=["q8_0-fp16", "fp32", "fp32-mins", "fp16-mins"])


@pytest.fixture(scope="module")
def q8(kernel_build_dir) -> Q8Gemv:
    if find_compiler() is None:
        pytest.skip("no C compiler (gcc or $CC) to build pagoda/kernels/cpu/q8_gemv.c")
    return Q8Gemv.load(kernel_build_dir)


def _runnable(q8: Q8Gemv, isa: int) -> int:
    if not q8.isa_supported(isa):
        pytest.skip(f"this CPU cannot run instruction set {isa} (so that path is untested here)")
    return isa


def _weight(n: int, k: int, layout: Layout, seed: int = 0) -> Int8Weight:
    """Grouped int8 with a few -128s (the one value whose magnitude int8 cannot hold)."""
    torch.manual_seed(seed)
    w = quantize_int8(torch.randn(n, k) * 0.05 + 0.01, group_size=32, asymmetric=layout.mins)
    w.q.view(-1)[::97] = -128
    dtype = torch.float16 if layout.half else torch.float32
    mins = None if w.mins is None else w.mins.to(dtype)
    return Int8Weight(w.q, w.scales.to(dtype), 32, mins)


def _operand(w: Int8Weight) -> Q8Operand:
    return Q8Gemv.operand(w.q, w.scales, w.mins)


def _reference(w: Int8Weight, xq: torch.Tensor, scale: torch.Tensor, total: torch.Tensor,
               ) -> tuple[torch.Tensor, torch.Tensor]:
    """The kernel's math in float64, and the sum of its terms' magnitudes (fp32 rounding of
    a sum is bounded by a multiple of that, whatever the order of addition)."""
    n, k = w.shape
    q = w.q.double().view(n, k // 32, 32)
    dots = torch.einsum("mgj,ngj->mng", xq.double().view(-1, k // 32, 32), q)
    products = dots * w.scales.double().unsqueeze(0) * scale.double().unsqueeze(1)
    mins = torch.zeros_like(products) if w.mins is None else (
        w.mins.double().unsqueeze(0) * total.double().unsqueeze(1))
    return (products + mins).sum(-1), (products.abs() + mins.abs()).sum(-1)


def _assert_within_fp32_rounding(y: torch.Tensor, want: torch.Tensor, bound: torch.Tensor):
    err = (y.double() - want).abs()
    assert (err <= 1e-5 * bound).all(), f"worst error / bound: {(err / bound).max().item():.2e}"


@ISAS
@WIDTHS
def test_activations_quantize_to_torchs_rounding_with_the_rounded_block_sum(q8, isa, width):
    _runnable(q8, isa)
    k = 576
    x = activations(3, k)
    xq, scale, total = quantize(q8, width, x, isa)
    assert_torchs_rounding(x, width, xq, scale, total)


@ISAS
@WIDTHS
@LAYOUTS
@pytest.mark.parametrize("k,n", SHAPES)
def test_product_matches_quantized_activations_times_the_int8_weight(q8, isa, width, layout,
                                                                     k, n):
    _runnable(q8, isa)
    w = _weight(n, k, layout)
    xq, scale, total = quantize(q8, width, activations(5, k))
    y = q8.gemm(_operand(w), xq, scale, total, isa)
    _assert_within_fp32_rounding(y, *_reference(w, xq, scale, total))


@WIDTHS
@pytest.mark.parametrize("m", range(1, 10))
def test_every_row_count_gives_each_rows_own_product(q8, width, m):
    """Rows pass two at a time: an odd count's last row, and any count, match one row alone."""
    w = _weight(963, 576, Layout(True, True))
    x = activations(m, 576)
    wide = width.dtype == torch.int16
    together = q8.linear(_operand(w), x, wide=wide)
    alone = torch.cat([q8.linear(_operand(w), x[i:i + 1], wide=wide) for i in range(m)])
    assert torch.equal(together, alone)
    _assert_within_fp32_rounding(together, *_reference(w, *quantize(q8, width, x)))


@WIDTHS
@LAYOUTS
@pytest.mark.parametrize("isa", [AVX2, AVX512_VNNI], ids=["avx2", "avx512-vnni"])
def test_vector_bodies_give_the_scalar_fallbacks_bits(q8, width, layout, isa):
    _runnable(q8, isa)
    w = _weight(963, 576, layout)
    x = activations(7, 576)
    quantized = [quantize(q8, width, x, i) for i in (SCALAR, isa)]
    for scalar, vector in zip(*quantized, strict=True):
        assert torch.equal(scalar, vector)
    scalar = q8.gemm(_operand(w), *quantized[0], SCALAR)
    assert torch.equal(q8.gemm(_operand(w), *quantized[1], isa), scalar)


@WIDTHS
def test_int16_activations_carry_x_nearly_exactly_and_int8_ones_to_a_percent(q8, width):
    w = _weight(963, 1536, Layout(True, False))
    x = activations(3, 1536)
    want = x.double() @ dequantize(w).double().T
    y = q8.linear(_operand(w), x, wide=width.dtype == torch.int16)
    error = ((y.double() - want).norm() / want.norm()).item()
    assert error < (1e-4 if width.dtype == torch.int16 else 2e-2)


def test_two_threads_give_one_threads_bits_on_torchs_openmp_runtime(q8):
    w, x = _weight(963, 1536, Layout(False, True)), activations(6, 1536)
    one = q8.linear(_operand(w), x, threads=1)
    assert torch.equal(one, q8.linear(_operand(w), x, threads=2))
    assert mapped_openmp_runtimes() == {os.path.realpath(torch_openmp_runtime())}


def test_weight_is_read_in_place_not_copied(q8):
    w = _weight(64, 576, Layout(True, False))
    operand = _operand(w)
    assert operand.q.data_ptr() == w.q.data_ptr()
    assert operand.scales.data_ptr() == w.scales.data_ptr()


@pytest.mark.parametrize("change, message", [
    (lambda w: Int8Weight(w.q[:, :560].contiguous(), w.scales[:, :17].contiguous(), 32), "multiple of 32"),
    (lambda w: Int8Weight(w.q.t(), w.scales, 32), "contiguous int8"),
    (lambda w: Int8Weight(w.q, w.scales.bfloat16(), 32), "float32 or float16"),
    (lambda w: Int8Weight(w.q, w.scales[:, :9].contiguous(), 32), "a group of 32"),
])
def test_layouts_the_kernel_cannot_read_in_place_are_refused(q8, change, message):
    w = change(_weight(64, 576, Layout(True, False)))
    with pytest.raises(ValueError, match=message):
        Q8Gemv.operand(w.q, w.scales, w.mins)
