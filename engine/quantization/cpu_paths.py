"""When a CPU linear layer multiplies through PyTorch's weight-only kernel and when it
dequantizes the layer and runs one GEMM instead: chosen by measurement on this machine.

The weight-only kernels (`_weight_int4pack_mm_for_cpu`, `_weight_int8pack_mm`) read a quarter or
an eighth of fp32's bytes, which is what a decode step of a few rows is bound by. With many rows
(prefill chunks, large batches) the multiply is bound by arithmetic instead, and there a plain
GEMM on a dequantized copy can win: by how much depends on the CPU (a bf16 GEMM is several times
faster than fp32 where the CPU has AVX512-BF16 or AMX, and several times slower where it has only
AVX2). So `calibrate` times both on one of the model's own layers at load.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

import torch

logger = logging.getLogger(__name__)

# Row counts timed at load; a step with more rows than the largest uses the largest's choice.
CALIBRATION_ROWS = (16, 64, 256)
# The kernel must lose to an fp32 GEMM by this much before a dequantized copy is kept.
_MIN_GAIN = 1.15
_REPEATS = 3


@dataclass(slots=True)
class CpuPathPolicy:
    """Shared by every layer of one format: steps of at least `dequantize_from_rows` rows
    dequantize into `gemm_dtype` and run one GEMM; None keeps the kernel for every step."""

    dequantize_from_rows: int | None = None
    gemm_dtype: torch.dtype = torch.float32
    reason: str = "not calibrated"


class CpuQuantizedMethod(Protocol):
    policy: CpuPathPolicy

    def kernel(self, x: torch.Tensor) -> torch.Tensor: ...
    def dequantized(self, dtype: torch.dtype) -> torch.Tensor: ...


def apply(method: CpuQuantizedMethod, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    threshold = method.policy.dequantize_from_rows
    if threshold is not None and x.shape[0] >= threshold:
        dtype = method.policy.gemm_dtype
        y = _dequantized_gemm(method, x.to(dtype)).to(x.dtype)
    else:
        y = method.kernel(x)
    return y if bias is None else y.add_(bias)


def calibrate(probe: CpuQuantizedMethod, max_rows: int) -> CpuPathPolicy:
    """Time the kernel against dequantize-and-GEMM on one layer (built with a policy that keeps
    its dequantizing source); the result is every layer of its format's policy."""
    policy = _choose(probe, [r for r in CALIBRATION_ROWS if r <= max_rows] or [max_rows])
    logger.info("CPU quantized linears: %s", policy.reason)
    return policy


def _choose(probe: CpuQuantizedMethod, rows: list[int]) -> CpuPathPolicy:
    k = probe.dequantized(torch.float32).shape[1]
    timings = {}
    for m in rows:
        x = torch.randn(m, k)
        timings[m] = (_best_time(probe.kernel, x), _best_time(_dequantized_gemm, probe, x),
                      _best_time(_dequantized_gemm, probe, x.bfloat16()))
    return _policy_from_timings(timings)


def _policy_from_timings(timings: dict[int, tuple[float, float, float]]) -> CpuPathPolicy:
    """Dequantize from the smallest row count at which, there and at every larger count, the
    weight-only kernel is slower than a plain fp32 GEMM would be: only then is the extra copy
    of the weights worth keeping (a 7B model's is 3.5 GB). The faster GEMM dtype runs."""
    rows = sorted(timings)
    table = ", ".join(f"{m} rows: kernel {t[0] * 1e3:.2f} ms, fp32 GEMM {t[1] * 1e3:.2f}, "
                      f"bf16 GEMM {t[2] * 1e3:.2f}" for m, t in sorted(timings.items()))
    needed = [timings[m][0] >= _MIN_GAIN * timings[m][1] for m in rows]
    for i, m in enumerate(rows):
        if all(needed[i:]):
            bf16 = all(timings[r][2] < timings[r][1] for r in rows[i:])
            dtype, name = (torch.bfloat16, "bf16") if bf16 else (torch.float32, "fp32")
            return CpuPathPolicy(m, dtype, f"{name} GEMM from {m} rows ({table})")
    return CpuPathPolicy(None, torch.float32, f"weight-only kernel for every step ({table})")


def _dequantized_gemm(method: CpuQuantizedMethod, x: torch.Tensor) -> torch.Tensor:
    return torch.nn.functional.linear(x, method.dequantized(x.dtype))


def _best_time(fn: Callable[..., object], *args: object) -> float:
    fn(*args)
    best = float("inf")
    for _ in range(_REPEATS):
        start = time.perf_counter()
        fn(*args)
        best = min(best, time.perf_counter() - start)
    return best
