"""Fixtures of the layers' tests: the CPU's decode ops, which the recurrent layers' fused
decode rows run on."""

import pytest

from pagoda.kernels.cpu import native
from pagoda.kernels.cpu.decode_ops import AVX2, BEST_ISA, SCALAR, DecodeOps, decode_kernel_ops
from pagoda.kernels.cpu.native import find_compiler
from pagoda.kernels.kernel_ops import KernelOps


@pytest.fixture(params=[SCALAR, AVX2], ids=["scalar", "avx2"])
def c_ops(request, kernel_build_dir) -> KernelOps:
    """The CPU's decode ops (decode_ops.c), its scalar or AVX2 bodies forced."""
    if find_compiler() is None:
        pytest.skip("no C compiler (gcc or $CC) to build pagoda/kernels/cpu/decode_ops.c")
    lib = native.load("decode_ops", kernel_build_dir)
    forcing = DecodeOps(lib)
    if not forcing.isa_supported(request.param):
        pytest.skip(f"this CPU cannot run instruction set {request.param}")
    forcing.set_isa(request.param)
    yield decode_kernel_ops(lib)
    forcing.set_isa(BEST_ISA)
