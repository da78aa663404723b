"""pagoda/kernels/cpu/q4_amx.c multiplies q4_gemv's int4 records (every format) by fp32 rows on AMX
tiles: the dequantized weights times each activation split into two bf16 parts, to fp32
rounding, whatever the rows' company or the threads. Skipped where this CPU has no AMX."""

import pytest
import torch
from block_quant_reference import activations

from pagoda.engine.quantization.tensors import Int4Weight, quantize_int4, unpack_int4, with_compact_scales
from pagoda.kernels.cpu.native import find_compiler
from pagoda.kernels.cpu.q4_amx import Q4Amx
from pagoda.kernels.cpu.q4_gemv import FP16_RECORDS, FP32_RECORDS, KQ_RECORDS, Q4Gemv, Q4Repacked
from tests.q4_k_weight import q4_k_weight

FORMATS = pytest.mark.parametrize("fmt", [FP32_RECORDS, FP16_RECORDS, KQ_RECORDS],
                                  ids=["fp32", "fp16", "q4_k"])
# Rows around a tile (16) and past the 64 a pass over a panel keeps; N = 963 and 5 leave a
# partial panel of weight rows (panels are 16), 5 a partial tile of records too.
ROWS = pytest.mark.parametrize("m", [1, 15, 16, 17, 33, 70])
SHAPES = pytest.mark.parametrize("n,k", [(960, 512), (963, 1536), (5, 768)])


@pytest.fixture(scope="module")
def libs(kernel_build_dir) -> tuple[Q4Gemv, Q4Amx]:
    if find_compiler() is None:
        pytest.skip("no C compiler (gcc or $CC) to build pagoda/kernels/cpu/q4_amx.c")
    amx = Q4Amx.load(kernel_build_dir)
    if not amx.available():
        pytest.skip("this CPU (or its OS) has no AMX with BF16, so q4_amx is untested here")
    return Q4Gemv.load(kernel_build_dir), amx


def _weight(q4: Q4Gemv, fmt: int, n: int, k: int) -> tuple[Int4Weight, Q4Repacked]:
    if fmt == KQ_RECORDS:
        w, parts = q4_k_weight(n, k)
        return w, q4.repack_kq(w.packed, parts.d, parts.dmin, parts.sc, parts.m)
    torch.manual_seed(0)
    w = quantize_int4(torch.randn(n, k) * 0.05)
    if fmt == FP16_RECORDS:
        w = with_compact_scales(Int4Weight(w.packed, w.scales.half().float(),
                                           w.mins.half().float(), w.group_size))
        return w, q4.repack(w.packed, w.scales, w.mins)
    return w, q4.repack(w.packed, w.scales.float(), w.mins.float())


def _split(x: torch.Tensor) -> torch.Tensor:
    """x as the kernel reads it: bf16(x) + bf16(x - bf16(x)), both rounded to nearest even."""
    high = x.bfloat16()
    low = (x - high.float()).bfloat16()
    return high.double() + low.double()


def _reference(w: Int4Weight, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The dequantized weights times x (float64), and the sum of the terms' magnitudes."""
    n, k = w.shape
    q = unpack_int4(w.packed).double().view(n, k // 32, 32)
    xb = x.view(x.shape[0], k // 32, 32)
    products = torch.einsum("mgj,ngj->mng", xb, q) * w.scales.double().unsqueeze(0)
    mins = w.mins.double().unsqueeze(0) * xb.sum(-1).unsqueeze(1)
    bound = (torch.einsum("mgj,ngj->mng", xb.abs(), q) * w.scales.double().abs().unsqueeze(0)
             + mins.abs())
    return (products + mins).sum(-1), bound.sum(-1)


@FORMATS
@SHAPES
@ROWS
def test_amx_product_is_the_dequantized_weights_times_bf16_split_activations(libs, fmt, n, k, m):
    q4, amx = libs
    w, repacked = _weight(q4, fmt, n, k)
    x = activations(m, k)
    want, bound = _reference(w, _split(x))
    err = (amx.linear(repacked, x).double() - want).abs()
    assert (err <= 1e-5 * bound).all(), f"worst error / bound: {(err / bound).max().item():.2e}"


@FORMATS
def test_amx_is_nearer_the_exact_product_than_int16_activations(libs, fmt):
    q4, amx = libs
    w, repacked = _weight(q4, fmt, 963, 1536)
    x = activations(33, 1536)
    exact = _reference(w, x.double())[0]
    amx_err = (amx.linear(repacked, x).double() - exact).norm() / exact.norm()
    int16_err = (q4.linear16(repacked, x).double() - exact).norm() / exact.norm()
    assert amx_err < 2e-5 and amx_err <= int16_err


def test_amx_rows_do_not_depend_on_their_company(libs):
    q4, amx = libs
    _, repacked = _weight(q4, FP16_RECORDS, 963, 512)
    x = activations(40, 512)
    together = amx.linear(repacked, x)
    for i in (0, 15, 16, 39):
        assert torch.equal(amx.linear(repacked, x[i:i + 1]), together[i:i + 1])


@pytest.mark.parametrize("m", [16, 70])
def test_amx_two_threads_give_one_threads_bits(libs, m):
    q4, amx = libs
    _, repacked = _weight(q4, KQ_RECORDS, 963, 1536)
    x = activations(m, 1536)
    assert torch.equal(amx.linear(repacked, x, threads=2), amx.linear(repacked, x, threads=1))


def test_amx_refuses_shapes_formats_and_instruction_sets_it_cannot_read(libs):
    q4, amx = libs
    _, repacked = _weight(q4, FP16_RECORDS, 64, 512)
    raw = amx.raw
    x, y = torch.randn(2, 512), torch.empty(2, 64)
    work = torch.empty(amx.workspace_bytes(2, 512), dtype=torch.uint8)

    def call(isa=-1, fmt=FP16_RECORDS, n=64, k=512, m=2):
        return raw.q4a_linear(isa, repacked.data.data_ptr(), fmt, n, k, x.data_ptr(), m,
                              y.data_ptr(), work.data_ptr(), 1)

    assert call() == 0 and call(isa=3) == 0
    assert call(isa=2) == -1  # q4_gemv's AVX-512 VNNI: not this library's
    assert call(k=500) == -1 and call(m=0) == -1 and call(n=0) == -1
    assert call(fmt=KQ_RECORDS, k=480) == -1  # Q4_K records take whole super-blocks
    assert call(fmt=7) == -1


def test_torchs_bf16_attention_and_ours_interleave_on_the_same_threads(libs):
    """torch's bf16 attention (oneDNN micro-kernels where the CPU has AMX) and ours take turns
    on torch's threads and each gives its own results. (That ours hands each thread back the
    tile configuration it found, amx_tiles.h, is what keeps a kernel that remembers its own
    loaded: this attention reconfigures each call and does not show it.)"""
    q4, amx = libs
    _, repacked = _weight(q4, FP16_RECORDS, 963, 512)
    x = activations(33, 512)
    torch.manual_seed(2)
    q, k, v = (torch.randn(1, 4, 256, 64).bfloat16() for _ in range(3))
    attention = torch.nn.functional.scaled_dot_product_attention
    want = attention(q, k, v, is_causal=True)
    for _ in range(3):
        y = amx.linear(repacked, x, threads=torch.get_num_threads())
        assert torch.equal(attention(q, k, v, is_causal=True), want)
    assert torch.equal(y, amx.linear(repacked, x, threads=torch.get_num_threads()))
