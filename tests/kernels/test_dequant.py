"""pagoda/kernels/cpu/dequant.c widens int4 weights exactly as the engine's torch dequantize does."""

import pytest
import torch

from pagoda.engine.quantization.tensors import (
    Int4Weight,
    dequantize,
    quantize_int4,
    quantize_int8,
    with_compact_scales,
)
from pagoda.kernels.cpu import native
from pagoda.kernels.cpu.dequant import AVX2, AVX512, SCALAR, Dequantizer
from pagoda.kernels.cpu.q4_gemv import Q4Gemv
from tests.q4_k_weight import q4_k_weight

ISAS = pytest.mark.parametrize("isa", [SCALAR, AVX2], ids=["scalar", "avx2"])
# int4 weights, in either layout, have a 512-bit path too.
INT4_ISAS = pytest.mark.parametrize("isa", [SCALAR, AVX2, AVX512],
                                      ids=["scalar", "avx2", "avx512"])


@pytest.fixture(scope="module")
def dq(kernel_build_dir) -> Dequantizer:
    if native.find_compiler() is None:
        pytest.skip("no C compiler (gcc or $CC)")
    return Dequantizer(native.load("dequant", kernel_build_dir))


def _runnable(dq: Dequantizer, isa: int) -> int:
    if isa == AVX2 and not dq.has_vector_path:
        pytest.skip("this CPU lacks AVX2/FMA/F16C, so that path is untested here")
    if isa == AVX512 and not dq.has_avx512_path:
        pytest.skip("this CPU lacks AVX-512 with BF16, so that path is untested here")
    return isa


def _weight(n: int, k: int, group: int = 32, compact: bool = False):
    """compact: Q4_1's kind, scales and mins fp16 values held in fp16."""
    torch.manual_seed(n * 7 + k)
    w = quantize_int4(torch.randn(n, k) * 0.05, group)
    if not compact:
        return w
    w = Int4Weight(w.packed, w.scales.half().float(), w.mins.half().float(), group)
    return with_compact_scales(w)


@INT4_ISAS
@pytest.mark.parametrize(("n", "k", "group"), [(576, 576, 32), (5, 1536, 32), (3, 128, 64),
                                               (7, 96, 32)])
def test_fp32_rows_equal_torch_dequantize(dq, isa, n, k, group):
    w = _weight(n, k, group)
    out = dq.int4_into(w.packed, w.scales, w.mins, torch.empty(n, k), _runnable(dq, isa))
    assert torch.equal(out, dequantize(w))


@INT4_ISAS
def test_fp16_scales_and_fp32_mins_mixed_are_read_as_stored(dq, isa):
    w = _weight(64, 256)
    mixed_scales = w.scales.half()
    exact = dequantize(type(w)(w.packed, mixed_scales.float(), w.mins, w.group_size))
    out = dq.int4_into(w.packed, mixed_scales, w.mins, torch.empty(64, 256), _runnable(dq, isa))
    assert torch.equal(out, exact)


@INT4_ISAS
def test_bf16_output_rounds_as_torch_does(dq, isa):
    w = _weight(96, 512, compact=True)
    out = dq.int4_into(w.packed, w.scales, w.mins, torch.empty(96, 512, dtype=torch.bfloat16),
                       _runnable(dq, isa))
    assert torch.equal(out, dequantize(w, torch.bfloat16))


def test_group_not_a_multiple_of_32_takes_the_scalar_path_exactly(dq):
    w = _weight(9, 96, group=16)
    assert torch.equal(dq.int4_into(w.packed, w.scales, w.mins, torch.empty(9, 96)),
                       dequantize(w))


def test_wrong_output_shape_is_refused(dq):
    w = _weight(4, 64)
    with pytest.raises(ValueError, match=r"\[4, 64\]"):
        dq.int4_into(w.packed, w.scales, w.mins, torch.empty(4, 32))


@ISAS
@pytest.mark.parametrize(("group", "asymmetric"), [(32, False), (32, True), (None, False)],
                         ids=["q8_0", "asymmetric-groups", "per-channel"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_int8_rows_equal_torch_dequantize(dq, isa, group, asymmetric, dtype):
    torch.manual_seed(3)
    w = quantize_int8(torch.randn(70, 192) * 0.05, group, asymmetric)
    out = dq.int8_into(w.q, w.scales, w.mins, torch.empty(70, 192, dtype=dtype),
                       _runnable(dq, isa))
    assert torch.equal(out, dequantize(w, dtype))


@pytest.fixture(scope="module")
def q4(kernel_build_dir) -> Q4Gemv:
    if native.find_compiler() is None:
        pytest.skip("no C compiler (gcc or $CC)")
    return Q4Gemv.load(kernel_build_dir)


@INT4_ISAS
@pytest.mark.parametrize("n", [576, 963, 5])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("compact", [False, True], ids=["fp32-records", "fp16-records"])
def test_q4_gemv_layout_widens_to_the_weight_it_was_repacked_from(dq, q4, isa, n, dtype,
                                                                  compact):
    w = _weight(n, 256, compact=True)
    scales, mins = (w.scales, w.mins) if compact else (w.scales.float(), w.mins.float())
    repacked = q4.repack(w.packed, scales, mins)
    assert repacked.compact == compact
    out = dq.q4_repacked_into(repacked, torch.empty(n, 256, dtype=dtype), _runnable(dq, isa))
    assert torch.equal(out, dequantize(w, dtype))


@INT4_ISAS
def test_q4_gemv_layout_with_scales_fp16_cannot_hold_widens_exactly(dq, q4, isa):
    w = with_compact_scales(_weight(963, 256))
    repacked = q4.repack(w.packed, w.scales, w.mins)
    assert not repacked.compact
    out = dq.q4_repacked_into(repacked, torch.empty(963, 256), _runnable(dq, isa))
    assert torch.equal(out, dequantize(w))


@INT4_ISAS
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_q4_gemv_layout_in_q4_k_records_widens_to_the_weight_it_was_repacked_from(dq, q4, isa,
                                                                                  dtype):
    w, parts = q4_k_weight(963, 512)
    repacked = q4.repack_kq(w.packed, parts.d, parts.dmin, parts.sc, parts.m)
    out = dq.q4_repacked_into(repacked, torch.empty(963, 512, dtype=dtype), _runnable(dq, isa))
    assert torch.equal(out, dequantize(w, dtype))


def test_entry_points_without_a_512_bit_path_refuse_it_in_words(dq):
    w = quantize_int8(torch.randn(8, 64), 32)
    with pytest.raises(ValueError, match="instruction set 2"):
        dq.int8_into(w.q, w.scales, w.mins, torch.empty(8, 64), AVX512)


@pytest.mark.parametrize("dtype", [torch.uint8, torch.float16, torch.float32])
def test_take_rows_equals_index_select_in_the_index_order(dq, dtype):
    torch.manual_seed(3)
    table = (torch.randn(37, 3, 10) * 50).to(dtype)
    index = torch.tensor([36, 0, 5, 5, 17], dtype=torch.int64)
    got = dq.take_rows(table, index)
    assert got.dtype == dtype and torch.equal(got, table.index_select(0, index))


def test_take_rows_refuses_an_index_outside_the_table_naming_it(dq):
    table = torch.arange(12, dtype=torch.float32).view(4, 3)
    with pytest.raises(IndexError, match=r"outside \[0, 4\)"):
        dq.take_rows(table, torch.tensor([1, 4]))
    with pytest.raises(IndexError, match=r"outside \[0, 4\)"):
        dq.take_rows(table, torch.tensor([-1]))


def test_take_rows_of_a_view_or_an_int32_index_is_torchs(dq):
    table = torch.arange(24, dtype=torch.float32).view(6, 4)
    view = table[:, 1:3]
    assert torch.equal(dq.take_rows(view, torch.tensor([5, 2])), view[[5, 2]])
    index32 = torch.tensor([3, 0], dtype=torch.int32)
    assert torch.equal(dq.take_rows(table, index32), table[[3, 0]])
    assert dq.take_rows(table, torch.tensor([], dtype=torch.int64)).shape == (0, 4)
