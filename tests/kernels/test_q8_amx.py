"""pagoda/kernels/cpu/q8_amx.c computes q8_gemv's int8 pass on AMX tiles: grouped int8 weights read in
place (fp16 or fp32 scales, with or without mins) times activations quantized per block of 32
exactly as q8_gemv quantizes them, to fp32 rounding, whatever the rows' company or the threads.
Skipped where this CPU has no AMX."""

import pytest
import torch
from block_quant_reference import activations

from pagoda.kernels.cpu.native import find_compiler
from pagoda.kernels.cpu.q8_amx import Q8Amx
from pagoda.kernels.cpu.q8_gemv import Q8Gemv, Q8Operand

ROWS = pytest.mark.parametrize("m", [1, 15, 16, 17, 33, 70])
# 963 and 5 leave a last panel of fewer than 16 weight rows.
SHAPES = pytest.mark.parametrize("n,k", [(960, 576), (963, 1536), (5, 64)])
PARAMS = pytest.mark.parametrize("dtype,with_mins", [
    (torch.float16, False), (torch.float32, False), (torch.float16, True), (torch.float32, True)],
    ids=["q8_0", "fp32-scales", "fp16-mins", "fp32-mins"])


@pytest.fixture(scope="module")
def libs(kernel_build_dir) -> tuple[Q8Gemv, Q8Amx]:
    if find_compiler() is None:
        pytest.skip("no C compiler (gcc or $CC) to build pagoda/kernels/cpu/q8_amx.c")
    amx = Q8Amx.load(kernel_build_dir)
    if not amx.available():
        pytest.skip("this CPU (or its OS) has no AMX, so q8_amx is untested here")
    return Q8Gemv.load(kernel_build_dir), amx


def _operand(n: int, k: int, dtype: torch.dtype, with_mins: bool,
             ) -> tuple[Q8Operand, tuple[torch.Tensor, ...]]:
    gen = torch.Generator().manual_seed(0)
    q = torch.randint(-128, 128, (n, k), generator=gen, dtype=torch.int8)
    scales = (torch.rand(n, k // 32, generator=gen) * 0.01).to(dtype)
    mins = ((torch.rand(n, k // 32, generator=gen) - 0.5) * 0.1).to(dtype) if with_mins else None
    return Q8Gemv.operand(q, scales, mins), (q, scales, mins)


def _reference(q8: Q8Gemv, parts: tuple, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """q8_gemv's int8 pass in float64 (its own quantization of x), and the sum of the terms'
    magnitudes."""
    q, scales, mins = parts
    n, k = q.shape
    xq, xscale, xsum = q8.quantize_rows(x)
    dots = torch.einsum("mgj,ngj->mng", xq.double().view(-1, k // 32, 32),
                        q.double().view(n, k // 32, 32))
    terms = dots * scales.double().unsqueeze(0) * xscale.double().unsqueeze(1)
    if mins is not None:
        terms = torch.cat((terms, mins.double().unsqueeze(0) * xsum.double().unsqueeze(1)), -1)
    return terms.sum(-1), terms.abs().sum(-1)


@PARAMS
@SHAPES
@ROWS
def test_amx_int8_pass_is_q8_gemvs_products_to_fp32_rounding(libs, dtype, with_mins, n, k, m):
    q8, amx = libs
    operand, parts = _operand(n, k, dtype, with_mins)
    x = activations(m, k)
    want, bound = _reference(q8, parts, x)
    err = (amx.linear(operand, x).double() - want).abs()
    assert (err <= 1e-5 * bound + 1e-30).all(), f"worst: {(err / bound).max().item():.2e}"


def test_amx_rows_do_not_depend_on_their_company(libs):
    _, amx = libs
    operand, _ = _operand(963, 576, torch.float16, False)
    x = activations(40, 576)
    together = amx.linear(operand, x)
    for i in (0, 16, 39):
        assert torch.equal(amx.linear(operand, x[i:i + 1]), together[i:i + 1])


@pytest.mark.parametrize("m", [16, 70])
def test_amx_two_threads_give_one_threads_bits(libs, m):
    _, amx = libs
    operand, _ = _operand(963, 1536, torch.float16, True)
    x = activations(m, 1536)
    assert torch.equal(amx.linear(operand, x, threads=2), amx.linear(operand, x, threads=1))


def test_amx_refuses_q6_k_blocks_shapes_and_other_instruction_sets(libs):
    _, amx = libs
    operand, _ = _operand(64, 512, torch.float16, False)
    q, scales, mins, halves = operand.pointers
    x, y = torch.randn(2, 512), torch.empty(2, 64)
    work = torch.empty(amx.workspace_bytes(2, 512), dtype=torch.uint8)

    def call(isa=-1, flags=halves, n=64, k=512, m=2):
        return amx.raw.q8a_linear(isa, q, scales, mins, flags, n, k, x.data_ptr(), m,
                                  y.data_ptr(), work.data_ptr(), 1)

    assert call() == 0 and call(isa=3) == 0
    assert call(flags=4) == -1  # Q6_K blocks: q8_gemv reads them, not this pass
    assert call(isa=1) == -1 and call(k=500) == -1 and call(m=0) == -1 and call(n=0) == -1
