"""q8_gemv multiplies GGUF IQ4_XS, Q5_K and Q3_K blocks read in place
(pagoda/kernels/cpu/iq4_xs_blocks.h, q5_k_blocks.h, q3_k_blocks.h) by activations quantized per block to int8 or int16: the weight is gguf's own
dequantization of the blocks, the product is the same math in float64 to fp32 rounding, and
every instruction set and thread count gives the same bits."""

import gguf
import numpy as np
import pytest
import torch
from block_quant_reference import WIDTHS, activations, quantize, runnable
from tiny_gguf import random_blocks

from pagoda.kernels.cpu.dequant import Dequantizer
from pagoda.kernels.cpu.native import find_compiler, load
from pagoda.kernels.cpu.q8_gemv import BLOCK_TYPES, SUPER_SCALED_TYPES, Q8Gemv

SCALAR, AVX2, AVX512_VNNI = 0, 1, 2
ISAS = pytest.mark.parametrize("isa", [SCALAR, AVX2, AVX512_VNNI],
                               ids=["scalar", "avx2", "avx512-vnni"])
TYPES = pytest.mark.parametrize("kind", ["IQ4_XS", "Q5_K", "Q3_K"])
# Odd N leaves a partial tile of rows (tiles are 4 rows); 512 inputs are two super-blocks.
SHAPES = [(512, 9), (256, 5)]


@pytest.fixture(scope="module")
def q8(kernel_build_dir) -> Q8Gemv:
    if find_compiler() is None:
        pytest.skip("no C compiler (gcc or $CC) to build pagoda/kernels/cpu/q8_gemv.c")
    return Q8Gemv.load(kernel_build_dir)


def _blocks(kind: str, n: int, k: int, seed: int = 0) -> torch.Tensor:
    """Random rows: every value, six-bit scale and min; small positive fp16 scales (IQ4_XS's
    subnormal, as real files' are)."""
    blocks = random_blocks(gguf.GGMLQuantizationType[kind], n, k, np.random.default_rng(seed))
    return torch.from_numpy(np.ascontiguousarray(blocks))


def _gguf_weight(kind: str, blocks: torch.Tensor, k: int) -> torch.Tensor:
    values = gguf.quants.dequantize(blocks.numpy(), gguf.GGMLQuantizationType[kind])
    return torch.from_numpy(np.array(values)).reshape(blocks.shape[0], k)


@TYPES
@ISAS
@WIDTHS
@pytest.mark.parametrize("k,n", SHAPES)
def test_blocks_product_is_quantized_activations_times_ggufs_own_weight(q8, kind, isa, width,
                                                                        k, n):
    isa = runnable(q8, isa)
    blocks = _blocks(kind, n, k)
    weight = _gguf_weight(kind, blocks, k).double().unsqueeze(0)
    for m in range(1, 5):  # a tile's activation rows go in pairs, then one alone
        xq, scale, total = quantize(q8, width, activations(m, k, seed=m), isa)
        y = q8.gemm(Q8Gemv.blocks_operand(blocks, kind), xq, scale, total, isa)
        terms = (xq.double() * scale.double().repeat_interleave(32, dim=1)).unsqueeze(1) * weight
        want, bound = terms.sum(-1), terms.abs().sum(-1)
        assert (y.double() - want).abs().le(bound * 2e-6 + 1e-30).all(), m


@TYPES
@WIDTHS
@pytest.mark.parametrize("isa", [AVX2, AVX512_VNNI], ids=["avx2", "avx512-vnni"])
@pytest.mark.parametrize("m", [1, 2, 3, 8])
def test_blocks_vector_bodies_give_the_scalar_fallbacks_bits(q8, kind, width, isa, m):
    isa = runnable(q8, isa)
    blocks, x = _blocks(kind, 9, 512, seed=2), activations(m, 512, seed=3)
    xq, scale, total = quantize(q8, width, x, SCALAR)
    operand = Q8Gemv.blocks_operand(blocks, kind)
    assert torch.equal(q8.gemm(operand, xq, scale, total, isa),
                       q8.gemm(operand, xq, scale, total, SCALAR))


@TYPES
@pytest.mark.parametrize("n", [64, 2050], ids=["one-share-a-thread", "chunks-as-threads-ask"])
def test_blocks_on_two_threads_give_one_threads_bits(q8, kind, n):
    blocks, x = _blocks(kind, n, 768, seed=4), activations(5, 768, seed=5)
    operand = Q8Gemv.blocks_operand(blocks, kind)
    assert torch.equal(q8.linear(operand, x, threads=2, wide=True),
                       q8.linear(operand, x, threads=1, wide=True))


@TYPES
def test_int16_activations_carry_x_nearly_exactly(q8, kind):
    blocks, x = _blocks(kind, 32, 512, seed=6), torch.randn(2, 512)
    exact = x.double() @ _gguf_weight(kind, blocks, 512).double().T
    y = q8.linear(Q8Gemv.blocks_operand(blocks, kind), x, wide=True)
    assert ((y.double() - exact).norm() / exact.norm()).item() < 1e-4


@TYPES
def test_blocks_are_read_in_place_not_copied(q8, kind):
    blocks = _blocks(kind, 8, 256)
    assert Q8Gemv.blocks_operand(blocks, kind).q.data_ptr() == blocks.data_ptr()


@pytest.mark.parametrize("kind, blocks, message", [
    ("IQ4_XS", torch.zeros(4, 136, dtype=torch.int8), "contiguous uint8"),
    ("IQ4_XS", torch.zeros(4, 140, dtype=torch.uint8), "whole 136-byte super-blocks"),
    ("Q5_K", torch.zeros(4, 0, dtype=torch.uint8), "whole 176-byte super-blocks"),
    ("Q5_K", torch.zeros(352, 4, dtype=torch.uint8).T, "contiguous uint8"),
    ("Q4_K", torch.zeros(4, 144, dtype=torch.uint8), "not Q4_K"),
])
def test_rows_the_kernel_cannot_read_are_refused(kind, blocks, message):
    with pytest.raises(ValueError, match=message):
        Q8Gemv.blocks_operand(blocks, kind)


def test_block_sizes_are_ggufs():
    for kind, (_, size) in BLOCK_TYPES.items():
        assert gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType[kind]] == (256, size)


@pytest.fixture(scope="module")
def dq(kernel_build_dir) -> Dequantizer:
    if find_compiler() is None:
        pytest.skip("no C compiler (gcc or $CC) to build pagoda/kernels/cpu/dequant.c")
    return Dequantizer(load("dequant", kernel_build_dir))


@TYPES
@pytest.mark.parametrize("isa", [SCALAR, AVX2], ids=["scalar", "avx2"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_blocks_widen_to_ggufs_reference_values(dq, kind, isa, dtype):
    if isa and not dq.has_vector_path:
        pytest.skip("this CPU has no AVX2 (so that path is untested here)")
    blocks = _blocks(kind, 7, 512, seed=7)
    out = dq.sub_blocks_into(blocks, kind, 512, torch.empty(7, 512, dtype=dtype), isa)
    assert torch.equal(out, _gguf_weight(kind, blocks, 512).to(dtype))


def test_widening_refuses_a_type_it_has_no_layout_for_and_rows_of_the_wrong_width(dq):
    out = torch.empty(2, 256)
    with pytest.raises(ValueError, match="no sub-block dequantization for 'Q4_K'"):
        dq.sub_blocks_into(torch.zeros(2, 144, dtype=torch.uint8), "Q4_K", 256, out)
    with pytest.raises(ValueError, match=r"IQ4_XS rows of 256 weights are uint8 \[2, 136\]"):
        dq.sub_blocks_into(torch.zeros(2, 135, dtype=torch.uint8), "IQ4_XS", 256, out)


SUPER_TYPES = pytest.mark.parametrize("kind", SUPER_SCALED_TYPES)


@pytest.mark.parametrize("isa", [SCALAR, AVX2], ids=["scalar", "avx2"])
def test_super_block_activations_share_one_scale_per_256_values(q8, isa):
    isa = runnable(q8, isa)
    x = activations(3, 768, seed=8)
    xq, scale, total = q8.quantize_rows_super(x, isa)
    supers = x.view(3, 3, 256)
    want_scale = (supers.abs().amax(-1) / 127).repeat_interleave(8, dim=1)
    assert torch.equal(scale, want_scale)
    want_q = torch.round(x / want_scale.repeat_interleave(32, dim=1))
    assert torch.equal(xq, want_q.to(torch.int8))
    assert torch.equal(total, scale * xq.view(3, 24, 32).sum(-1).float())


@SUPER_TYPES
@pytest.mark.parametrize("isa", [SCALAR, AVX2, AVX512_VNNI],
                         ids=["scalar", "avx2", "avx512-vnni"])
@pytest.mark.parametrize("k,n", SHAPES)
def test_super_block_product_is_the_activations_times_ggufs_own_weight(q8, kind, isa, k, n):
    isa = runnable(q8, isa)
    blocks = _blocks(kind, n, k, seed=9)
    weight = _gguf_weight(kind, blocks, k).double().unsqueeze(0)
    operand = Q8Gemv.blocks_operand(blocks, kind)
    for m in (1, 2, 3, 4, 7):  # a pass takes 4 activation rows, then 2, then 1
        xq, scale, total = q8.quantize_rows_super(activations(m, k, seed=m), isa)
        y = q8.gemm(operand, xq, scale, total, isa, super_scales=True)
        terms = (xq.double() * scale.double().repeat_interleave(32, dim=1)).unsqueeze(1) * weight
        want, bound = terms.sum(-1), terms.abs().sum(-1)
        assert (y.double() - want).abs().le(bound * 2e-6 + 1e-30).all(), m


@SUPER_TYPES
def test_int8_linear_on_super_scaled_types_quantizes_per_super_block(q8, kind):
    blocks, x = _blocks(kind, 10, 512, seed=10), activations(3, 512, seed=11)
    operand = Q8Gemv.blocks_operand(blocks, kind)
    xq, scale, total = q8.quantize_rows_super(x)
    assert torch.equal(q8.linear(operand, x), q8.gemm(operand, xq, scale, total,
                                                      super_scales=True))
    assert torch.equal(q8.linear(operand, x, threads=2), q8.linear(operand, x, threads=1))


@SUPER_TYPES
def test_super_block_products_at_the_largest_values_do_not_wrap(q8, kind):
    """Every weight at its type's largest magnitude and every activation at +-127: the int16
    pairs and int32 sums of the super-block passes at their bounds."""
    blocks = _blocks(kind, 8, 512, seed=12).numpy().copy()
    level_at = {"IQ4_XS": (slice(8, 136), 0x00),   # index 0 of the table: -127
                "Q5_K": (slice(16, 176), 0xFF),    # 31 (fifth bits and nibbles all set)
                "Q6_K": (slice(0, 192), 0xFF)}     # 63 - 32 = 31
    at, byte = level_at[kind]
    rows = blocks.reshape(8, 2, -1)
    rows[:, :, at] = byte
    blocks = torch.from_numpy(rows.reshape(8, -1).copy())
    weight = _gguf_weight(kind, blocks, 512).double()
    x = torch.full((8, 512), 3.0)  # eight rows: Q6_K's pass of eight (below) too
    x[1::2, ::2] = -3.0
    operand = Q8Gemv.blocks_operand(blocks, kind)
    xq, scale, total = q8.quantize_rows_super(x)
    assert xq.abs().eq(127).all()
    want = (xq.double() * scale.double().repeat_interleave(32, dim=1)) @ weight.T
    y = q8.gemm(operand, xq, scale, total, super_scales=True)
    assert (y.double() - want).abs().le(want.abs() * 1e-5 + 1e-6).all()


@pytest.mark.parametrize("m", [2, 3, 7, 8, 9, 11, 13, 16, 17])
def test_q6_k_rows_in_eights_get_the_bits_each_row_gets_alone(q8, m):
    """Int8 activations pass Q6_K tiles eight rows at a time (made unsigned, the weights' share
    of the 128 taken back once per tile row), the rest in fours, then the last one to three in
    one pass: a row's output does not depend on the rows beside it or on the thread count."""
    blocks, x = _blocks("Q6_K", 9, 512, seed=13), activations(m, 512, seed=14)
    operand = Q8Gemv.blocks_operand(blocks, "Q6_K")
    alone = torch.cat([q8.linear(operand, x[i:i + 1]) for i in range(m)])
    assert torch.equal(q8.linear(operand, x), alone)
    assert torch.equal(q8.linear(operand, x, threads=2), alone)


def test_q6_k_pass_of_eight_rows_holds_the_most_negative_weights_and_scales(q8):
    """Every value -32 (bits all clear), every scale -128, activations +-127: the unsigned
    activations' pairs reach 2 x 255 x 32 and the sums 8 x 2 x 2 x 255 x 32 x 128 before the
    128's share is taken back."""
    blocks = _blocks("Q6_K", 8, 512, seed=15).numpy().copy()
    rows = blocks.reshape(8, 2, -1)
    rows[:, :, 0:192] = 0x00
    rows[:, :, 192:208] = 0x80
    blocks = torch.from_numpy(rows.reshape(8, -1).copy())
    weight = _gguf_weight("Q6_K", blocks, 512).double()
    x = torch.full((8, 512), 3.0)
    x[1::2] = -3.0
    x[2::4, 1::2] = -3.0
    operand = Q8Gemv.blocks_operand(blocks, "Q6_K")
    xq, scale, total = q8.quantize_rows_super(x)
    want = (xq.double() * scale.double().repeat_interleave(32, dim=1)) @ weight.T
    y = q8.gemm(operand, xq, scale, total, super_scales=True)
    assert (y.double() - want).abs().le(want.abs() * 1e-5 + 1e-6).all()
