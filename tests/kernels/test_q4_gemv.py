"""pagoda/kernels/cpu/q4_gemv.c computes int8-quantized activations times int4 weights exactly as the
same math in torch (float64), to fp32 rounding, on every instruction set this CPU has."""

import os

import pytest
import torch
from block_quant_reference import WIDTHS, activations, assert_torchs_rounding, quantize

from pagoda.engine.quantization.tensors import (
    Int4Weight,
    quantize_int4,
    unpack_int4,
    with_compact_scales,
)
from pagoda.kernels.cpu.native import find_compiler, mapped_openmp_runtimes, torch_openmp_runtime
from pagoda.kernels.cpu.q4_gemv import KQ_RECORDS, Q4Gemv, Q4Repacked
from tests.q4_k_weight import q4_k_weight

SCALAR, AVX2, AVX512_VNNI = 0, 1, 2
ISAS = pytest.mark.parametrize("isa", [SCALAR, AVX2, AVX512_VNNI],
                               ids=["scalar", "avx2", "avx512-vnni"])
# N = 963 and 5 leave a partial tile of rows (tiles are 4 rows).
SHAPES = [(576, 960), (576, 576), (1536, 960), (1536, 576), (576, 963), (1536, 5)]


@pytest.fixture(scope="module")
def q4(kernel_build_dir) -> Q4Gemv:
    if find_compiler() is None:
        pytest.skip("no C compiler (gcc or $CC) to build pagoda/kernels/cpu/q4_gemv.c")
    return Q4Gemv.load(kernel_build_dir)


def _runnable(q4: Q4Gemv, isa: int) -> int:
    if not q4.isa_supported(isa):
        pytest.skip(f"this CPU cannot run instruction set {isa} (so that path is untested here)")
    return isa


def _weight(n: int, k: int, seed: int = 0) -> Int4Weight:
    torch.manual_seed(seed)
    return quantize_int4(torch.randn(n, k) * 0.05)


def _fp16_weight(n: int, k: int, seed: int = 0) -> Int4Weight:
    """Q4_1's kind: every scale and min an fp16 value, held in fp16 (`with_compact_scales`)."""
    w = _weight(n, k, seed)
    return with_compact_scales(Int4Weight(w.packed, w.scales.half().float(),
                                          w.mins.half().float(), w.group_size))


def _both_formats(q4: Q4Gemv, w: Int4Weight) -> tuple[Q4Repacked, Q4Repacked]:
    """The weight in fp32 records and in compact (fp16) ones."""
    fp32 = q4.repack(w.packed, w.scales.float(), w.mins.float())
    compact = q4.repack(w.packed, w.scales, w.mins)
    assert not fp32.compact and compact.compact
    return fp32, compact


def _reference(w: Int4Weight, xq: torch.Tensor, scale: torch.Tensor, total: torch.Tensor,
               ) -> tuple[torch.Tensor, torch.Tensor]:
    """The kernel's math in float64, and the sum of its terms' magnitudes (fp32 rounding of
    a sum is bounded by a multiple of that, whatever the order of addition)."""
    n, k = w.shape
    q = unpack_int4(w.packed).double().view(n, k // 32, 32)
    dots = torch.einsum("mgj,ngj->mng", xq.double().view(-1, k // 32, 32), q)
    sw, mw = w.scales.double(), w.mins.double()
    products = dots * sw.unsqueeze(0) * scale.double().unsqueeze(1)
    mins = mw.unsqueeze(0) * total.double().unsqueeze(1)
    return (products + mins).sum(-1), (products.abs() + mins.abs()).sum(-1)


def _assert_within_fp32_rounding(y: torch.Tensor, want: torch.Tensor, bound: torch.Tensor):
    err = (y.double() - want).abs()
    assert (err <= 1e-5 * bound).all(), f"worst error / bound: {(err / bound).max().item():.2e}"


@ISAS
@WIDTHS
@pytest.mark.parametrize("k", [576, 1536])
def test_activations_quantize_to_torchs_rounding_with_the_rounded_block_sum(q4, isa, width, k):
    _runnable(q4, isa)
    x = activations(3, k)
    xq, scale, total = quantize(q4, width, x, isa)
    assert_torchs_rounding(x, width, xq, scale, total)


@ISAS
@WIDTHS
@pytest.mark.parametrize("k,n", SHAPES)
@pytest.mark.parametrize("m", [1, 3, 16])
def test_product_matches_quantized_activations_times_int4_weights(q4, isa, width, m, k, n):
    _runnable(q4, isa)
    w = _weight(n, k)
    xq, scale, total = quantize(q4, width, activations(m, k), isa)
    gemm = q4.gemm if width.dtype == torch.int8 else q4.gemm16
    y = gemm(q4.repack(w.packed, w.scales, w.mins), xq, scale, total, isa)
    _assert_within_fp32_rounding(y, *_reference(w, xq, scale, total))


@pytest.mark.parametrize("k,n", [(576, 963), (1536, 5)])
def test_partial_tile_writes_its_rows_and_nothing_past_the_output(q4, k, n):
    m = 3
    w, x = _weight(n, k), activations(m, k)
    buffer = torch.full((m * n + 64,), 12345.0)
    y = buffer[: m * n].view(m, n)
    q4.linear_into(q4.repack(w.packed, w.scales, w.mins), x, y, q4.workspace(m, k))
    xq, scale, total = q4.quantize_rows(x)
    _assert_within_fp32_rounding(y, *_reference(w, xq, scale, total))
    assert (buffer[m * n:] == 12345.0).all()


@pytest.mark.parametrize("k,n", [(576, 963), (1536, 576)])
def test_scalar_fallback_and_avx2_agree(q4, k, n):
    _runnable(q4, AVX2)
    w, x = _weight(n, k), activations(16, k)
    quantized = [q4.quantize_rows(x, isa) for isa in (SCALAR, AVX2)]
    assert torch.equal(quantized[0][0], quantized[1][0])
    assert torch.equal(quantized[0][1], quantized[1][1])
    assert torch.equal(quantized[0][2], quantized[1][2])
    repacked = q4.repack(w.packed, w.scales, w.mins)
    scalar = q4.gemm(repacked, *quantized[0], SCALAR)
    avx2 = q4.gemm(repacked, *quantized[1], AVX2)
    _, bound = _reference(w, *quantized[0])
    assert ((scalar.double() - avx2.double()).abs() <= 2e-5 * bound).all()


def test_two_threads_give_one_threads_bits_on_torchs_openmp_runtime(q4):
    w, x = _weight(963, 1536), activations(16, 1536)
    repacked = q4.repack(w.packed, w.scales, w.mins)
    one, two = q4.linear(repacked, x, threads=1), q4.linear(repacked, x, threads=2)
    assert torch.equal(one, two)
    assert mapped_openmp_runtimes() == {os.path.realpath(torch_openmp_runtime())}


def test_input_width_not_a_multiple_of_32_is_refused(q4):
    with pytest.raises(ValueError, match="multiple of 32"):
        q4.quantize_rows(torch.randn(1, 40))


def _exact_product(w: Int4Weight, x: torch.Tensor) -> torch.Tensor:
    n, k = w.shape
    q = unpack_int4(w.packed).double().view(n, k // 32, 32)
    weights = (q * w.scales.double().unsqueeze(-1) + w.mins.double().unsqueeze(-1)).view(n, k)
    return x.double() @ weights.T


@pytest.mark.parametrize("isa", [SCALAR, AVX2], ids=["scalar", "avx2"])
@pytest.mark.parametrize("k,n", [(576, 963), (1536, 576)])
@pytest.mark.parametrize("m", [1, 3])
def test_split_activations_come_within_fp32_noise_of_the_exact_product(q4, isa, m, k, n):
    """One int8 pass is off by the rounding of x (~1/254 of a block's largest value); high plus
    low parts leave ~1/254 of that: the split must be at least 50x closer, and close in itself."""
    _runnable(q4, isa)
    w, x = _weight(n, k), activations(m, k)
    repacked, exact = q4.repack(w.packed, w.scales, w.mins), _exact_product(w, x)
    scale = exact.abs().max()
    one_pass = (q4.linear(repacked, x, isa).double() - exact).abs().max() / scale
    split = (q4.linear_split(repacked, x, isa).double() - exact).abs().max() / scale
    assert split < one_pass / 50, f"split {split:.2e}, one pass {one_pass:.2e}"
    assert split < 1e-4


def test_split_activations_on_two_threads_give_one_threads_bits(q4):
    w, x = _weight(963, 1536), activations(4, 1536)
    repacked = q4.repack(w.packed, w.scales, w.mins)
    assert torch.equal(q4.linear_split(repacked, x, threads=1),
                       q4.linear_split(repacked, x, threads=2))


@pytest.mark.parametrize("isa", [SCALAR, AVX2], ids=["scalar", "avx2"])
@pytest.mark.parametrize("k,n", [(576, 963), (1536, 576)])
@pytest.mark.parametrize("m", [1, 3])
def test_int16_activations_are_as_close_to_the_exact_product_as_the_split(q4, isa, m, k, n):
    """~1/65534 of a block's largest value, where the split leaves ~1/64516: one pass, one
    dot product per weight block, as close as two int8 ones."""
    _runnable(q4, isa)
    w, x = _weight(n, k), activations(m, k)
    repacked, exact = q4.repack(w.packed, w.scales, w.mins), _exact_product(w, x)
    scale = exact.abs().max()
    split = (q4.linear_split(repacked, x, isa).double() - exact).abs().max() / scale
    int16 = (q4.linear16(repacked, x, isa).double() - exact).abs().max() / scale
    assert int16 < 1e-4 and int16 < 2 * split, f"int16 {int16:.2e}, split {split:.2e}"


@pytest.mark.parametrize("kind", ["fp32", "q4_k"])
def test_large_layers_split_in_chunks_as_threads_ask_give_one_threads_bits(q4, kind):
    """4,098 rows: 1,025 tiles, past where threads take chunks of 32 tiles as they come free
    (the last chunk one tile, partial). Every pass, the rows the exact product's."""
    n, k = 4098, 256
    fp32, kq = _fp32_and(q4, "q4_k", n, k)
    w = kq if kind == "q4_k" else fp32
    x = activations(3, k)
    for linear in (q4.linear, q4.linear16):
        one = linear(w, x, threads=1)
        assert torch.equal(linear(w, x, threads=2), one), linear.__name__
    weight = q4_k_weight(n, k)[0]
    assert _relative_error(q4.linear16(w, x, threads=2), _exact_product(weight, x)) < 1e-4


def _relative_error(got: torch.Tensor, want: torch.Tensor) -> float:
    return ((got.double() - want).norm() / want.norm()).item()


def test_int16_activations_on_two_threads_give_one_threads_bits(q4):
    w, x = _weight(963, 1536), activations(4, 1536)
    repacked = q4.repack(w.packed, w.scales, w.mins)
    assert torch.equal(q4.linear16(repacked, x, threads=1), q4.linear16(repacked, x, threads=2))


def test_compact_records_are_80_bytes_per_128_weights_against_96(q4):
    fp32, compact = _both_formats(q4, _fp16_weight(963, 576))
    records = (963 + 3) // 4 * (576 // 32)
    assert fp32.data.numel() == 96 * records and compact.data.numel() == 80 * records


def _fp32_and(q4: Q4Gemv, kind: str, n: int, k: int) -> tuple[Q4Repacked, Q4Repacked]:
    """One weight in fp32 records and in smaller ones of the same values: "fp16" (Q4_1's
    kind: fp16 scales and mins) or "q4_k" (Q4_K's six-bit sub-scales, fp16 d per 256)."""
    if kind == "fp16":
        return _both_formats(q4, _fp16_weight(n, k))
    w, parts = q4_k_weight(n, k)
    fp32 = q4.repack(w.packed, w.scales, w.mins)
    kq = q4.repack_kq(w.packed, parts.d, parts.dmin, parts.sc, parts.m)
    assert kq.record_format == KQ_RECORDS and not fp32.compact
    return fp32, kq


SMALLER_RECORDS = pytest.mark.parametrize("kind", ["fp16", "q4_k"])


def test_q4_k_records_are_592_bytes_per_1024_weights_against_768(q4):
    fp32, kq = _fp32_and(q4, "q4_k", 963, 1536)
    tiles = (963 + 3) // 4
    assert fp32.data.numel() == tiles * 96 * (1536 // 32)
    assert kq.data.numel() == tiles * 592 * (1536 // 256)


@ISAS
@WIDTHS
@SMALLER_RECORDS
@pytest.mark.parametrize("k,n", [(512, 963), (1536, 576), (1536, 5)])
@pytest.mark.parametrize("m", [1, 3, 16])
def test_smaller_records_give_the_fp32_records_bits(q4, isa, width, kind, m, k, n):
    """Their scales and mins widened (fp16) or rebuilt (d * sc, -(dmin * m)) in fp32 exactly:
    the products are the same arithmetic."""
    _runnable(q4, isa)
    fp32, smaller = _fp32_and(q4, kind, n, k)
    quantized = quantize(q4, width, activations(m, k), isa)
    gemm = q4.gemm if width.dtype == torch.int8 else q4.gemm16
    assert torch.equal(gemm(smaller, *quantized, isa), gemm(fp32, *quantized, isa))


@ISAS
@SMALLER_RECORDS
def test_smaller_records_give_the_fp32_records_bits_in_every_linear(q4, isa, kind):
    _runnable(q4, isa)
    fp32, smaller = _fp32_and(q4, kind, 963, 1536)
    x = activations(3, 1536)
    # AVX-512's int16 pass reads Q4_K records in its own arithmetic (per super-block, below).
    linears = (q4.linear, q4.linear_split) if _kq_on_avx512(kind, isa) else (
        q4.linear, q4.linear_split, q4.linear16)
    for linear in linears:
        assert torch.equal(linear(smaller, x, isa), linear(fp32, x, isa)), linear.__name__
        assert torch.equal(linear(smaller, x, isa, threads=2), linear(fp32, x, isa)), (
            linear.__name__)


INT16_RECORDS = pytest.mark.parametrize("kind", ["fp32", "fp16", "q4_k"])


def _records(q4: Q4Gemv, kind: str, n: int, k: int) -> Q4Repacked:
    if kind == "fp32":
        w = _weight(n, k)
        return q4.repack(w.packed, w.scales.float(), w.mins.float())
    return _fp32_and(q4, kind, n, k)[1]


@INT16_RECORDS
@pytest.mark.parametrize("k,n", [(512, 963), (1536, 5)])
def test_int16_pass_on_avx2_gives_the_scalar_bodys_bits(q4, kind, k, n):
    """Both add each block's exact integer dot to its row's sum by one fma of s_w * s_x, and
    the mins apart, in one order: the same bits (a sum of lanes in fp32 would not be)."""
    _runnable(q4, AVX2)
    w, x = _records(q4, kind, n, k), activations(7, k)
    assert torch.equal(q4.linear16(w, x, SCALAR), q4.linear16(w, x, AVX2))
    quantized = q4.quantize_rows16(x, AVX2)
    assert torch.equal(q4.gemm16(w, *quantized, SCALAR), q4.gemm16(w, *quantized, AVX2))


@pytest.mark.parametrize("isa", [SCALAR, AVX2], ids=["scalar", "avx2"])
@INT16_RECORDS
@pytest.mark.parametrize("m", [6, 7])
def test_int16_pass_gives_a_row_its_one_row_calls_bits_whatever_rows_share_the_call(
        q4, isa, kind, m):
    """Rows pass in fours, then three, two or one (6 = 4 + 2, 7 = 4 + 3); a decode step's row
    must not change with the batch beside it."""
    _runnable(q4, isa)
    w, x = _records(q4, kind, 963, 512), activations(m, 512)
    together = q4.linear16(w, x, isa)
    for i in range(x.shape[0]):
        assert torch.equal(together[i:i + 1], q4.linear16(w, x[i:i + 1], isa)), f"row {i}"


def _kq_on_avx512(kind: str, isa: int) -> bool:
    return kind == "q4_k" and isa == AVX512_VNNI


def _rounded_per_super_block(x: torch.Tensor) -> torch.Tensor:
    """x as the int16 pass of Q4_K records on AVX-512 sees it: s_x = max |x| / 32767 per 256
    inputs, x / s_x rounded to nearest even, times s_x (float64)."""
    m, k = x.shape
    supers = x.view(m, k // 256, 256)
    scale = supers.abs().amax(-1, keepdim=True) / 32767
    safe = torch.where(scale == 0, torch.ones_like(scale), scale)
    return (torch.round(supers / safe).double() * scale.double()).view(m, k)


def _assert_the_product_of_super_block_activations(y: torch.Tensor, w: Int4Weight,
                                                   x: torch.Tensor) -> None:
    """y is the rounded activations times the weights, to fp32 rounding of its terms."""
    n, k = w.shape
    q = unpack_int4(w.packed).double().view(n, k // 32, 32)
    weights = (q * w.scales.double().unsqueeze(-1) + w.mins.double().unsqueeze(-1)).view(n, k)
    xr = _rounded_per_super_block(x)
    bound = xr.abs() @ weights.abs().T
    _assert_within_fp32_rounding(y, xr @ weights.T, bound)


@pytest.mark.parametrize("k,n", [(512, 963), (1536, 576), (1536, 5)])
@pytest.mark.parametrize("m", [1, 2, 3, 4, 7, 16])
def test_q4_k_int16_pass_on_avx512_sums_each_super_block_in_integers(q4, m, k, n):
    """One s_x per 256 activations (as llama.cpp's Q8_K, with 16 bits instead of 8): each
    block's dot times its six-bit sc, and its sum of q_x times its m, add up as integers over
    the super-block; the result is the exact product of those activations, to fp32 rounding,
    at every row count (rows pass in fours, twos and ones)."""
    _runnable(q4, AVX512_VNNI)
    w, parts = q4_k_weight(n, k)
    kq = q4.repack_kq(w.packed, parts.d, parts.dmin, parts.sc, parts.m)
    x = activations(m, k)
    _assert_the_product_of_super_block_activations(q4.linear16(kq, x, AVX512_VNNI), w, x)


def test_q4_k_integer_sums_hold_the_largest_weights_and_activations(q4):
    """Every q 15, every sc and m 63, every activation the block's largest: each int32 lane
    reaches 8 x 63 x 8 x 15 x 32767 (within 2^31) and nothing wraps."""
    _runnable(q4, AVX512_VNNI)
    n, k = 8, 512
    _, parts = q4_k_weight(n, k)
    packed = torch.full((n, k // 2), 0xFF, dtype=torch.uint8)
    sc = torch.full_like(parts.sc, 63)
    d = torch.full_like(parts.d, 1e-3)
    kq = q4.repack_kq(packed, d, d, sc, sc)
    scales = d.float().repeat_interleave(8, dim=1) * 63
    w = Int4Weight(packed, scales, -scales)
    for sign in (1.0, -1.0):
        x = torch.full((1, k), sign * 3.0)
        y = q4.linear16(kq, x, AVX512_VNNI)
        _assert_the_product_of_super_block_activations(y, w, x)
        assert torch.allclose(y.double(), _exact_product(w, x), rtol=1e-6)


def test_q4_k_int16_pass_on_avx512_gives_two_threads_one_threads_bits(q4):
    _runnable(q4, AVX512_VNNI)
    w, parts = q4_k_weight(963, 1536)
    kq = q4.repack_kq(w.packed, parts.d, parts.dmin, parts.sc, parts.m)
    x = activations(5, 1536)
    assert torch.equal(q4.linear16(kq, x, AVX512_VNNI, threads=1),
                       q4.linear16(kq, x, AVX512_VNNI, threads=2))


def test_q4_k_records_refuse_a_width_of_partial_super_blocks(q4):
    w, parts = q4_k_weight(8, 512)
    with pytest.raises(ValueError, match="multiple of 256"):
        q4.repack_kq(w.packed[:, :144], parts.d, parts.dmin, parts.sc[:, :9], parts.m[:, :9])


def test_scales_fp16_cannot_hold_get_fp32_records_and_stay_exact(q4):
    """Q4_K's kind: d * sub-scale needs more than fp16's 11 bits, so with_compact_scales keeps
    fp32 and the records stay fp32, the product the float64 math's to fp32 rounding."""
    w = with_compact_scales(_weight(963, 576))
    assert w.scales.dtype == torch.float32
    repacked = q4.repack(w.packed, w.scales, w.mins)
    assert not repacked.compact
    xq, scale, total = q4.quantize_rows16(activations(3, 576))
    _assert_within_fp32_rounding(q4.gemm16(repacked, xq, scale, total),
                                 *_reference(w, xq, scale, total))


@pytest.mark.parametrize("record_format", [3, KQ_RECORDS], ids=["unknown", "q4_k-k64"])
def test_a_record_format_that_does_not_exist_or_fit_the_width_is_refused(q4, record_format):
    fp32, _ = _both_formats(q4, _fp16_weight(4, 64))
    x = torch.randn(1, 64)
    y, work = torch.empty(1, 4), q4.workspace(1, 64)
    assert q4.raw.q4_linear(AVX2 if q4.isa_supported(AVX2) else SCALAR, fp32.data.data_ptr(),
                            record_format, 4, 64, x.data_ptr(), 1, y.data_ptr(), work.data_ptr(),
                            1) == -1


@pytest.mark.parametrize("kind", ["fp32", "fp16", "q4_k"])
@pytest.mark.parametrize("m", [1, 2, 4, 7, 8, 15, 32])
def test_int16_pass_on_avx512_four_rows_a_register_matches_the_exact_product_at_any_row_count(
        q4, kind, m):
    """The 512-bit body takes activation rows eight at a time and the rest in fours, twos and
    ones: every count is a different split."""
    _runnable(q4, AVX512_VNNI)
    n, k = 963, 1536
    fp32, smaller = _fp32_and(q4, "q4_k" if kind == "q4_k" else "fp16", n, k)
    w = fp32 if kind == "fp32" else smaller
    xq, scale, total = q4.quantize_rows16(activations(m, k), AVX2)
    y = q4.gemm16(w, xq, scale, total, AVX512_VNNI)
    weight = _fp16_weight(n, k) if kind != "q4_k" else q4_k_weight(n, k)[0]
    _assert_within_fp32_rounding(y, *_reference(weight, xq, scale, total))


@ISAS
@pytest.mark.parametrize("kind", ["fp32", "q4_k"])
@pytest.mark.parametrize("m", [3, 6, 7, 13])
def test_every_activation_row_gets_the_product_it_gets_alone(q4, isa, kind, m):
    """Rows pass a tile in chunks (eight, then four, two, one on AVX-512; fours for Q4_K
    records there; fours, then two, one on AVX2): a row's output does not depend on the rows
    beside it, so a sequence's tokens do not depend on its batch."""
    _runnable(q4, isa)
    k = 512
    if kind == "q4_k":
        repacked = _fp32_and(q4, "q4_k", 963, k)[1]
    else:
        w = _weight(963, k)
        repacked = q4.repack(w.packed, w.scales, w.mins)
    x = activations(m, k)
    alone = torch.cat([q4.linear16(repacked, x[i:i + 1], isa) for i in range(m)])
    assert torch.equal(q4.linear16(repacked, x, isa), alone)
