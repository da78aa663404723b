"""q8_gemv multiplies GGUF Q6_K blocks read in place (pagoda/kernels/cpu/q6_k_blocks.h) by activations
quantized per block to int8 or int16: the weight is gguf's own dequantization of the blocks,
the product is the same math in float64 to fp32 rounding, and every instruction set and thread
count gives the same bits. dequant.c widens the same blocks to gguf's values exactly."""

import gguf
import numpy as np
import pytest
import torch
from block_quant_reference import WIDTHS, activations, quantize
from tiny_gguf import random_blocks

from pagoda.kernels.cpu.dequant import Dequantizer
from pagoda.kernels.cpu.native import find_compiler, load
from pagoda.kernels.cpu.q8_gemv import Q8Gemv

SCALAR, AVX2, AVX512_VNNI = 0, 1, 2
ISAS = pytest.mark.parametrize("isa", [SCALAR, AVX2, AVX512_VNNI],
                               ids=["scalar", "avx2", "avx512-vnni"])
# Odd N leaves a partial tile of rows (tiles are 4 rows); 512 inputs are two super-blocks.
SHAPES = [(512, 9), (256, 5), (768, 64)]


@pytest.fixture(scope="module")
def q8(kernel_build_dir) -> Q8Gemv:
    if find_compiler() is None:
        pytest.skip("no C compiler (gcc or $CC) to build pagoda/kernels/cpu/q8_gemv.c")
    return Q8Gemv.load(kernel_build_dir)


@pytest.fixture(scope="module")
def dq(kernel_build_dir) -> Dequantizer:
    if find_compiler() is None:
        pytest.skip("no C compiler (gcc or $CC) to build pagoda/kernels/cpu/dequant.c")
    return Dequantizer(load("dequant", kernel_build_dir))


def _runnable(q8: Q8Gemv, isa: int) -> int:
    if not q8.isa_supported(isa):
        pytest.skip(f"this CPU cannot run instruction set {isa} (so that path is untested here)")
    return isa


def _blocks(n: int, k: int, seed: int = 0) -> torch.Tensor:
    """Random Q6_K rows: every six-bit value and int8 sub-scale, -128 included."""
    blocks = random_blocks(gguf.GGMLQuantizationType.Q6_K, n, k, np.random.default_rng(seed))
    return torch.from_numpy(np.ascontiguousarray(blocks))


def _gguf_weight(blocks: torch.Tensor, k: int) -> torch.Tensor:
    values = gguf.quants.dequantize(blocks.numpy(), gguf.GGMLQuantizationType.Q6_K)
    return torch.from_numpy(np.array(values)).reshape(blocks.shape[0], k)


@ISAS
@WIDTHS
@pytest.mark.parametrize("k,n", SHAPES)
def test_q6_k_product_is_quantized_activations_times_ggufs_own_weight(q8, isa, width, k, n):
    isa = _runnable(q8, isa)
    blocks = _blocks(n, k)
    xq, scale, total = quantize(q8, width, activations(3, k), isa)
    y = q8.gemm(Q8Gemv.q6_k_operand(blocks), xq, scale, total, isa)
    terms = (xq.double() * scale.double().repeat_interleave(32, dim=1)).unsqueeze(1) \
        * _gguf_weight(blocks, k).double().unsqueeze(0)
    want, bound = terms.sum(-1), terms.abs().sum(-1)
    assert (y.double() - want).abs().le(bound * 2e-6 + 1e-30).all()


@WIDTHS
@pytest.mark.parametrize("isa", [AVX2, AVX512_VNNI], ids=["avx2", "avx512-vnni"])
@pytest.mark.parametrize("m", [1, 2, 3, 8])
def test_q6_k_vector_bodies_give_the_scalar_fallbacks_bits(q8, width, isa, m):
    isa = _runnable(q8, isa)
    blocks, x = _blocks(9, 512, seed=2), activations(m, 512, seed=3)
    xq, scale, total = quantize(q8, width, x, SCALAR)
    operand = Q8Gemv.q6_k_operand(blocks)
    assert torch.equal(q8.gemm(operand, xq, scale, total, isa),
                       q8.gemm(operand, xq, scale, total, SCALAR))


@WIDTHS
@pytest.mark.parametrize("n", [64, 2050], ids=["one-share-a-thread", "chunks-as-threads-ask"])
def test_q6_k_on_two_threads_gives_one_threads_bits(q8, width, n):
    """2,050 rows: 513 tiles, past where threads take chunks of 32 tiles as they come free
    (the last chunk short, the last tile partial)."""
    blocks, x = _blocks(n, 768, seed=4), activations(5, 768, seed=5)
    operand = Q8Gemv.q6_k_operand(blocks)
    wide = width.dtype == torch.int16
    assert torch.equal(q8.linear(operand, x, threads=2, wide=wide),
                       q8.linear(operand, x, threads=1, wide=wide))


def test_q6_k_int16_activations_carry_x_nearly_exactly(q8):
    blocks, x = _blocks(32, 512, seed=6), torch.randn(2, 512)
    exact = x.double() @ _gguf_weight(blocks, 512).double().T
    y = q8.linear(Q8Gemv.q6_k_operand(blocks), x, wide=True)
    assert ((y.double() - exact).norm() / exact.norm()).item() < 1e-4


def test_q6_k_blocks_are_read_in_place_not_copied(q8):
    blocks = _blocks(8, 256)
    assert Q8Gemv.q6_k_operand(blocks).q.data_ptr() == blocks.data_ptr()


@pytest.mark.parametrize("blocks, message", [
    (torch.zeros(4, 210, dtype=torch.int8), "contiguous uint8"),
    (torch.zeros(4, 200, dtype=torch.uint8), "whole 210-byte super-blocks"),
    (torch.zeros(4, 0, dtype=torch.uint8), "whole 210-byte super-blocks"),
    (torch.zeros(420, 4, dtype=torch.uint8).T, "contiguous uint8"),
])
def test_q6_k_rows_the_kernel_cannot_read_are_refused(blocks, message):
    with pytest.raises(ValueError, match=message):
        Q8Gemv.q6_k_operand(blocks)


@pytest.mark.parametrize("isa", [0, 1], ids=["scalar", "avx2"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_q6_k_widens_to_gguf_reference_values(dq, isa, dtype):
    if isa and not dq.has_vector_path:
        pytest.skip("this CPU has no AVX2 (so that path is untested here)")
    blocks = _blocks(7, 512, seed=7)
    out = dq.q6_k_into(blocks, 512, torch.empty(7, 512, dtype=dtype), isa)
    assert torch.equal(out, _gguf_weight(blocks, 512).to(dtype))
