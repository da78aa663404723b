"""Weight-only int4 and int8 matmuls: the Triton split-K GEMV (a few rows) and GEMM (more rows)
match the torch reference, and the torch reference is the engine's dequantize followed by a matmul.

On a GPU every test but `test_autotuned_gemvs_match_the_reference` runs the untimed configs
(`heuristic_config`, `_gemm_tiles`): autotuning each test's shapes would cost more than the tests.
"""

import inspect
import itertools
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from kernel_device import DEVICE, KERNEL_DTYPES, assert_close
from triton.compiler import ASTSource

from pagoda.kernels import torch_ref, triton_quant, triton_quant_gemv
from pagoda.kernels.kernel_ops import TORCH_OPS
from pagoda.kernels.ops import triton_ops

GROUP = 32
# M = 1 and 3 take the GEMV (3 with a padded row), 17 the GEMM (padded rows, columns and K).
SHAPES = list(itertools.product([1, 3, 17], [32, 48], [64, 96]))
# bf16 scales only where bf16 is trusted: a real GPU (see kernel_device).
SCALE_DTYPES = [d for d in KERNEL_DTYPES if d != torch.float32]


@pytest.fixture(autouse=True)
def untimed_configs(monkeypatch):
    monkeypatch.setattr(triton_quant_gemv, "AUTOTUNE", False)


def randn(*shape, dtype=torch.float32, gen=None):
    return torch.randn(*shape, generator=gen).to(device=DEVICE, dtype=dtype)


def int4_weight(n: int, k: int, scale_dtype=torch.float32, seed=0, group=GROUP):
    """Random packed bytes with scales and mins like a quantized layer's: w in about [-0.4, 0.4]."""
    gen = torch.Generator().manual_seed(seed)
    packed = torch.randint(0, 256, (n, k // 2), dtype=torch.uint8, generator=gen)
    scales = torch.rand(n, k // group, generator=gen) * 0.04 + 0.02
    mins = -7.5 * scales + torch.randn(n, k // group, generator=gen) * 0.05
    return packed.to(DEVICE), scales.to(DEVICE, scale_dtype), mins.to(DEVICE, scale_dtype)


def int8_weight(n: int, k: int, scale_dtype=torch.float32, seed=0):
    gen = torch.Generator().manual_seed(seed)
    q = torch.randint(-127, 128, (n, k), dtype=torch.int8, generator=gen)
    scales = torch.rand(n, generator=gen) * 0.003 + 0.001
    return q.to(DEVICE), scales.to(DEVICE, scale_dtype)


def bias_or_none(with_bias: bool, n: int, dtype) -> torch.Tensor | None:
    return randn(n, dtype=dtype) if with_bias else None


@pytest.mark.parametrize("with_bias", [False, True])
@pytest.mark.parametrize("dtype", KERNEL_DTYPES)
@pytest.mark.parametrize(("m", "n", "k"), SHAPES)
def test_int4_linear_matches_reference(m, n, k, dtype, with_bias):
    packed, scales, mins = int4_weight(n, k)
    x, bias = randn(m, k, dtype=dtype), bias_or_none(with_bias, n, dtype)
    out = triton_quant.int4_linear(x, packed, scales, mins, GROUP, bias)
    assert out.shape == (m, n) and out.dtype == dtype
    assert_close(out, torch_ref.int4_linear(x, packed, scales, mins, GROUP, bias))


@pytest.mark.parametrize("with_bias", [False, True])
@pytest.mark.parametrize("dtype", KERNEL_DTYPES)
@pytest.mark.parametrize(("m", "n", "k"), SHAPES)
def test_int8_linear_matches_reference(m, n, k, dtype, with_bias):
    q, scales = int8_weight(n, k)
    x, bias = randn(m, k, dtype=dtype), bias_or_none(with_bias, n, dtype)
    out = triton_quant.int8_linear(x, q, scales, bias)
    assert out.shape == (m, n) and out.dtype == dtype
    assert_close(out, torch_ref.int8_linear(x, q, scales, bias))


# Split-K: N 20 is two column tiles of 16 (the second mostly masked); K 512 is 64 int4 words or
# 128 int8 words a column, four tiles of 16 or 32 words: one for each of four splits.
@pytest.mark.parametrize("group", [32, 128])
@pytest.mark.parametrize("with_bias", [False, True])
@pytest.mark.parametrize("dtype", KERNEL_DTYPES)
@pytest.mark.parametrize("m", [1, 3])
def test_int4_split_k_gemv_matches_reference(m, dtype, with_bias, group):
    packed, scales, mins = int4_weight(20, 512, group=group)
    x, bias = randn(m, 512, dtype=dtype), bias_or_none(with_bias, 20, dtype)
    out = torch.empty(m, 20, dtype=dtype, device=DEVICE)
    triton_quant_gemv.int4_gemv(out, x, triton_quant_gemv.as_words(packed), scales, mins, group,
                                bias, triton_quant_gemv.GemvConfig(16, 16, 4))
    assert_close(out, torch_ref.int4_linear(x, packed, scales, mins, group, bias))


@pytest.mark.parametrize("with_bias", [False, True])
@pytest.mark.parametrize("dtype", KERNEL_DTYPES)
@pytest.mark.parametrize("m", [1, 3])
def test_int8_split_k_gemv_matches_reference(m, dtype, with_bias):
    q, scales = int8_weight(20, 512)
    x, bias = randn(m, 512, dtype=dtype), bias_or_none(with_bias, 20, dtype)
    out = torch.empty(m, 20, dtype=dtype, device=DEVICE)
    triton_quant_gemv.int8_gemv(out, x, triton_quant_gemv.as_words(q), scales, bias,
                                triton_quant_gemv.GemvConfig(16, 32, 4))
    assert_close(out, torch_ref.int8_linear(x, q, scales, bias))


@pytest.mark.parametrize("m", [1, 4])
def test_every_int4_gemv_config_the_autotuner_may_pick_matches_reference(m):
    """Each config timed on a GPU, launched directly: K 2048 gives every one its full split count
    (up to 8), N 24 a partial column tile to each."""
    packed, scales, mins = int4_weight(24, 2048)
    x, bias = randn(m, 2048, dtype=torch.float16), randn(24, dtype=torch.float16)
    words = triton_quant_gemv.as_words(packed)
    expected = torch_ref.int4_linear(x, packed, scales, mins, GROUP, bias)
    configs = triton_quant_gemv.configs_for(triton_quant_gemv.INT4_GEMV_CONFIGS, m, 256, GROUP // 8)
    assert len(configs) == (8 if m == 1 else 2)
    for config in configs:
        out = torch.empty(m, 24, dtype=x.dtype, device=DEVICE)
        triton_quant_gemv.int4_gemv(out, x, words, scales, mins, GROUP, bias, config)
        assert_close(out, expected)


@pytest.mark.parametrize("m", [1, 4])
def test_every_int8_gemv_config_the_autotuner_may_pick_matches_reference(m):
    q, scales = int8_weight(24, 2048)
    x, bias = randn(m, 2048, dtype=torch.float16), randn(24, dtype=torch.float16)
    words = triton_quant_gemv.as_words(q)
    expected = torch_ref.int8_linear(x, q, scales, bias)
    for config in triton_quant_gemv.configs_for(triton_quant_gemv.INT8_GEMV_CONFIGS, m, 512):
        out = torch.empty(m, 24, dtype=x.dtype, device=DEVICE)
        triton_quant_gemv.int8_gemv(out, x, words, scales, bias, config)
        assert_close(out, expected)


def test_split_k_gives_the_same_bits_on_every_call():
    """The splits' sums are added in a fixed order, and each launch leaves its tile counters
    ready for the next (a stale counter would leave the second output unwritten)."""
    packed, scales, mins = int4_weight(24, 512)
    q, scales8 = int8_weight(24, 512)
    x = randn(2, 512)
    config = triton_quant_gemv.GemvConfig(16, 16, 4)
    outs4, outs8 = [], []
    for _ in range(2):
        outs4.append(torch.empty(2, 24, device=DEVICE))
        triton_quant_gemv.int4_gemv(outs4[-1], x, triton_quant_gemv.as_words(packed), scales,
                                    mins, GROUP, None, config)
        outs8.append(torch.empty(2, 24, device=DEVICE))
        triton_quant_gemv.int8_gemv(outs8[-1], x, triton_quant_gemv.as_words(q), scales8, None,
                                    config)
    assert torch.equal(outs4[0], outs4[1]) and torch.equal(outs8[0], outs8[1])
    assert_close(outs4[0], torch_ref.int4_linear(x, packed, scales, mins, GROUP))
    assert_close(outs8[0], torch_ref.int8_linear(x, q, scales8))


def test_weights_whose_rows_are_not_whole_words_take_the_gemm_at_one_row():
    """int4 groups of 4 (a word would span two groups) and int8 with K = 30 (rows of 30 bytes)."""
    x = randn(1, 64)
    packed, scales, mins = int4_weight(24, 64, group=4)
    assert_close(triton_quant.int4_linear(x, packed, scales, mins, 4),
                 torch_ref.int4_linear(x, packed, scales, mins, 4))
    q, scales8 = int8_weight(24, 30)
    x = randn(1, 30)
    assert triton_quant_gemv.as_words(q) is None
    assert_close(triton_quant.int8_linear(x, q, scales8), torch_ref.int8_linear(x, q, scales8))


def test_gemv_configs_for_four_rows_keep_their_accumulators_small():
    for configs in (triton_quant_gemv.INT4_GEMV_CONFIGS, triton_quant_gemv.INT8_GEMV_CONFIGS):
        for k_words in (8, 512, 1792):
            kept = triton_quant_gemv.configs_for(configs, 4, k_words)
            assert kept and all(c.acc_per_thread(4) <= 16 for c in kept)


def test_gemm_configs_cover_whole_groups_and_no_more_rows_than_the_bucket():
    for c in triton_quant.gemm_configs(torch.bfloat16, 16, 128):
        assert c.kwargs["BLOCK_M"] == 16 and c.kwargs["BLOCK_K"] % 128 == 0
    fp32 = triton_quant.gemm_configs(torch.float32, 256, 1)
    assert [c.kwargs for c in fp32] == [c.kwargs for c in triton_quant.GEMM_CONFIGS_FP32]


@pytest.mark.skipif(DEVICE.type != "cuda", reason="the interpreter does not autotune")
def test_autotuned_gemvs_match_the_reference(monkeypatch):
    monkeypatch.setattr(triton_quant_gemv, "AUTOTUNE", True)
    packed, scales, mins = int4_weight(256, 1024, torch.float16)
    q, scales8 = int8_weight(256, 1024, torch.float16)
    x = randn(1, 1024, dtype=torch.bfloat16)
    assert_close(triton_quant.int4_linear(x, packed, scales, mins, GROUP),
                 torch_ref.int4_linear(x, packed, scales, mins, GROUP))
    assert_close(triton_quant.int8_linear(x, q, scales8), torch_ref.int8_linear(x, q, scales8))


def test_no_rows_give_an_empty_product():
    """A step where no sequence samples calls the lm_head with zero rows."""
    packed, scales, mins = int4_weight(32, 64)
    q, q_scales = int8_weight(32, 64)
    x = randn(0, 64)
    assert triton_quant.int4_linear(x, packed, scales, mins, GROUP).shape == (0, 32)
    assert triton_quant.int8_linear(x, q, q_scales).shape == (0, 32)


@pytest.mark.parametrize("scale_dtype", SCALE_DTYPES)
@pytest.mark.parametrize("m", [1, 17])
def test_half_precision_scales_give_the_reference_result(m, scale_dtype):
    x = randn(m, 64, dtype=torch.float16)
    packed, scales, mins = int4_weight(48, 64, scale_dtype)
    assert_close(triton_quant.int4_linear(x, packed, scales, mins, GROUP),
                 torch_ref.int4_linear(x, packed, scales, mins, GROUP))
    q, scales8 = int8_weight(48, 64, scale_dtype)
    assert_close(triton_quant.int8_linear(x, q, scales8), torch_ref.int8_linear(x, q, scales8))


@pytest.mark.parametrize("m", [1, 3, 17])
def test_strided_activations_and_weight_rows(m):
    """x a column slice of a wider tensor and a transposed one; weights a row slice of a fused
    (larger) layer, so neither has its contiguous strides."""
    wide = randn(m, 160)
    packed, scales, mins = int4_weight(80, 96)
    q, scales8 = int8_weight(80, 96)
    weights4 = packed[16:64], scales[16:64], mins[16:64]
    for x in (wide[:, 32:128], randn(96, m).t()):
        assert_close(triton_quant.int4_linear(x, *weights4, GROUP),
                     torch_ref.int4_linear(x, *weights4, GROUP))
        assert_close(triton_quant.int8_linear(x, q[16:64], scales8[16:64]),
                     torch_ref.int8_linear(x, q[16:64], scales8[16:64]))


def test_leading_dimensions_are_kept():
    x = randn(2, 3, 64)
    packed, scales, mins = int4_weight(32, 64)
    q, scales8 = int8_weight(32, 64)
    out4 = triton_quant.int4_linear(x, packed, scales, mins, GROUP)
    out8 = triton_quant.int8_linear(x, q, scales8)
    assert out4.shape == out8.shape == (2, 3, 32)
    assert_close(out4, torch_ref.int4_linear(x, packed, scales, mins, GROUP))
    assert_close(out8, torch_ref.int8_linear(x, q, scales8))


def test_torch_int4_linear_is_dequantize_then_matmul():
    # engine is imported here, not at the top: importing it pulls in the loader's dependencies,
    # which the GPU check's kernel-test stage does not need to have.
    from pagoda.engine.quantization.tensors import dequantize, quantize_int4

    gen = torch.Generator().manual_seed(1)
    w, x, bias = (torch.randn(*s, generator=gen) for s in ((48, 96), (5, 96), (48,)))
    weight = quantize_int4(w)
    out = torch_ref.int4_linear(x, weight.packed, weight.scales, weight.mins, weight.group_size,
                                bias)
    torch.testing.assert_close(out, x @ dequantize(weight).t() + bias)


def test_torch_int8_linear_is_dequantize_then_matmul():
    from pagoda.engine.quantization.tensors import dequantize, quantize_int8

    gen = torch.Generator().manual_seed(2)
    w, x, bias = (torch.randn(*s, generator=gen) for s in ((48, 96), (5, 96), (48,)))
    weight = quantize_int8(w)
    torch.testing.assert_close(torch_ref.int8_linear(x, weight.q, weight.scales, bias),
                               x @ dequantize(weight).t() + bias)


def test_torch_reference_returns_half_inputs_in_half():
    from pagoda.engine.quantization.tensors import dequantize, quantize_int4

    weight = quantize_int4(torch.randn(32, 64))
    x = torch.randn(3, 64)
    out = torch_ref.int4_linear(x.half(), weight.packed, weight.scales, weight.mins, GROUP)
    assert out.dtype == torch.float16
    torch.testing.assert_close(out.float(), x.half().float() @ dequantize(weight).t(),
                               atol=2e-3, rtol=2e-3)


def test_ops_dispatch_the_quantized_linears():
    assert TORCH_OPS.int4_linear is torch_ref.int4_linear
    assert TORCH_OPS.int8_linear is torch_ref.int8_linear
    ops = triton_ops()
    assert ops.int4_linear is triton_quant.int4_linear
    assert ops.int8_linear is triton_quant.int8_linear


# Compiles what the wrappers would launch on an H200, through Triton's own compiler and the
# ptxas it bundles: no GPU needed. Run in a fresh process, where TRITON_INTERPRET is unset.
_COMPILE_FOR_HOPPER = r'''
import inspect, os, re, subprocess, sys, tempfile
import torch, triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from pagoda.kernels import triton_quant as tq, triton_quant_gemv as tqg

TYPES = {torch.bfloat16: "bf16", torch.float16: "fp16", torch.float32: "fp32",
         torch.uint8: "u8", torch.int8: "i8", torch.int32: "i32"}
CUOBJDUMP = os.path.join(os.path.dirname(triton.__file__), "backends/nvidia/bin/cuobjdump")
launches = []

class Record:
    def __init__(self, kernel):
        self.kernel = kernel
    def __getitem__(self, grid):
        return lambda *args, **kwargs: launches.append((self.kernel, args, kwargs))

def compile_as_launched(kernel, args, kwargs):
    """As the JIT specializes: 16-byte aligned pointers, ints of 1 constant, multiples of 16."""
    options = {k: kwargs.pop(k) for k in ("num_warps", "num_stages") if k in kwargs}
    signature, constexprs, attrs = {}, dict(kwargs), {}
    positional = iter(args)
    for i, name in enumerate(inspect.signature(kernel.fn).parameters):
        if name in kwargs:
            signature[name] = "constexpr"
            continue
        value = next(positional)
        if name in kernel.do_not_specialize:
            signature[name] = "i32"
        elif isinstance(value, torch.Tensor):
            signature[name], attrs[(i,)] = "*" + TYPES[value.dtype], [["tt.divisibility", 16]]
        elif value == 1:
            signature[name], constexprs[name] = "constexpr", 1
        else:
            signature[name] = "i32"
            if value % 16 == 0:
                attrs[(i,)] = [["tt.divisibility", 16]]
    src = ASTSource(kernel, signature, constexprs, attrs)
    return triton.compile(src, target=GPUTarget("cuda", 90, 32), options=options)

def stack_bytes(compiled):
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(compiled.asm["cubin"])
        f.flush()
        usage = subprocess.run([CUOBJDUMP, "-res-usage", f.name], capture_output=True,
                               text=True, check=True).stdout
    return int(re.search(r"STACK:(\d+)", usage).group(1))

def candidates(kernel, args, kwargs):
    """(x's dtype, kwargs) for each config the autotuner may time in place of the recorded one."""
    name = kernel.fn.__name__
    if "gemv" in name:
        configs = tqg.INT4_GEMV_CONFIGS if "int4" in name else tqg.INT8_GEMV_CONFIGS
        k_words = args[10] if "int4" in name else args[9]
        for c in tqg.configs_for(configs, kwargs["BLOCK_M"], k_words,
                                 kwargs.get("WORDS_PER_GROUP", 1)):
            yield args[3].dtype, {**kwargs, **c.meta()}
    else:
        group = 2 * kwargs.get("HALF_GROUP", 0) or 1
        bucket = args[9] if "int4" in name else args[8]
        for c in tq.gemm_configs(args[1].dtype, bucket, group):
            yield args[1].dtype, {**kwargs, **c.kwargs, "num_warps": c.num_warps,
                                  "num_stages": c.num_stages}

for module, names in ((tqg, ("_int4_gemv_kernel", "_int8_gemv_kernel")),
                      (tq, ("_int4_gemm_kernel", "_int8_gemm_kernel"))):
    for name in names:
        setattr(module, name, Record(getattr(module, name)))
tqg.AUTOTUNE = False  # record the untimed launches; every config is compiled below
tqg.sm_count = lambda device: 132  # an H200
meta = torch.device("meta")
for dtype in (torch.bfloat16, torch.float32):
    for m, n in ((1, 4096), (1, 14336), (4, 4096), (512, 4096)):
        x = torch.empty(m, 4096, device=meta, dtype=dtype)
        bias = torch.empty(n, device=meta, dtype=dtype)
        s = torch.empty(n, 128, device=meta, dtype=torch.float16)
        tq.int4_linear(x, torch.empty(n, 2048, device=meta, dtype=torch.uint8), s, s, 32, bias)
        tq.int8_linear(x, torch.empty(n, 4096, device=meta, dtype=torch.int8), s[:, 0], bias)
seen = set()
for kernel, args, kwargs in launches:
    for dtype, config in candidates(kernel, args, dict(kwargs)):
        label = f"{kernel.fn.__name__} {dtype} {config}"
        if label not in seen:
            seen.add(label)
            spilled = stack_bytes(compile_as_launched(kernel, args, config))
            print(label, "spills" if spilled else "ok", flush=True)
'''


@pytest.mark.skipif(DEVICE.type == "cuda", reason="on a GPU every other test compiles them")
def test_kernels_compile_for_hopper_without_spilling():
    """The interpreter skips Triton's type checks and register allocation: compile for sm_90
    every config the autotuner may time, for decode (1 and 4 rows) and prefill, bf16 and fp32."""
    if "attrs" not in inspect.signature(ASTSource).parameters:
        pytest.skip("this triton's ASTSource predates the attrs argument")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["TRITON_DEFAULT_FP_FUSION"] = "1"  # the default; set to silence triton's warning
    result = subprocess.run([sys.executable, "-c", _COMPILE_FOR_HOPPER], check=False, env=env,
                            capture_output=True, text=True, timeout=600,
                            cwd=Path(__file__).parents[2])
    assert result.returncode == 0, result.stderr[-3000:]
    assert "spills" not in result.stdout, result.stdout
