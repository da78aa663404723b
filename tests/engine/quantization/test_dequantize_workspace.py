"""Layers widened for a GEMM share one buffer and equal torch's dequantize exactly."""

import pytest
import torch

from pagoda.engine.quantization.dequantize_workspace import DequantWorkspace
from pagoda.engine.quantization.tensors import dequantize, quantize_int4, quantize_int8
from pagoda.kernels.cpu import native


@pytest.fixture
def workspace(monkeypatch, kernels_cache_dir) -> DequantWorkspace:
    if native.find_compiler() is None:
        pytest.skip("no C compiler (gcc or $CC)")
    monkeypatch.setenv("PAGODA_CACHE_DIR", str(kernels_cache_dir))
    built = DequantWorkspace.for_this_machine()
    assert built.native
    return built


def test_layers_share_one_buffer_grown_to_the_largest(workspace):
    small = quantize_int4(torch.randn(64, 128))
    large = quantize_int4(torch.randn(256, 128))
    a = workspace.dequantize(small, torch.float32)
    assert torch.equal(a, dequantize(small))
    b = workspace.dequantize(large, torch.float32)
    assert torch.equal(b, dequantize(large))
    c = workspace.dequantize(small, torch.float32)
    assert c.data_ptr() == b.data_ptr() and workspace.nbytes == 256 * 128 * 4


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_grouped_int8_equals_torch_dequantize(workspace, dtype):
    w = quantize_int8(torch.randn(48, 96), 32, asymmetric=True)
    assert torch.equal(workspace.dequantize(w, dtype), dequantize(w, dtype))


def test_without_the_kernel_torch_dequantizes(monkeypatch):
    monkeypatch.setenv("PAGODA_NATIVE_KERNELS", "0")
    workspace = DequantWorkspace.for_this_machine()
    w = quantize_int4(torch.randn(8, 64))
    assert not workspace.native
    assert torch.equal(workspace.dequantize(w, torch.float32), dequantize(w))
    assert workspace.nbytes == 0
