"""Which kernel a CPU int4 linear layer multiplies through, PyTorch's weight-only one or our
q4_gemv (`cpu_q4`), and when it dequantizes the layer and runs one GEMM instead: chosen by
measurement on this machine, per step size.

The weight-only kernels (`_weight_int4pack_mm_for_cpu`, `_weight_int8pack_mm`) read a quarter or
an eighth of fp32's bytes, which is what a decode step of a few rows is bound by. With many rows
(prefill chunks, large batches) the multiply is bound by arithmetic instead, and there a plain
GEMM on a dequantized copy can win: by how much depends on the CPU (a bf16 GEMM is several times
faster than fp32 where the CPU has AVX512-BF16 or AMX, and several times slower where it has only
AVX2). So `calibrate` times them all on one of the model's own layers at load, and with them,
where this CPU has AMX, q4_amx (pagoda/kernels/cpu/q4_amx.c): q4_gemv's records multiplied on the
tiles, which wins steps of many rows.
"""

from __future__ import annotations

import logging
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from functools import partial
from typing import Protocol

import torch

from pagoda.engine.quantization.dequantize_workspace import DequantWorkspace

logger = logging.getLogger(__name__)

# Row counts timed at load: both weight-only kernels at each, the dequantized GEMM from 16 rows
# (it never wins below). A step of a count between two uses the smaller's choice.
CALIBRATION_ROWS = (1, 2, 4, 16, 64, 256)
_GEMM_FROM_ROWS = 16
# q4_amx is timed from this many rows: below, one tile of 16 rows is mostly empty and it never
# wins (0.35-0.62x q4_gemv's speed at 1-4 rows on a Xeon with AMX).
_AMX_FROM_ROWS = 4
# The kernel must lose to the faster GEMM dtype by this much before steps dequantize.
_MIN_GAIN = 1.15
# PyTorch's int4 kernel takes one-row steps only where it beats q4_gemv by this much per call:
# with q4_gemv a decode step runs as one C call (pagoda/engine/models/native_decode.py), which a
# per-call timing cannot see. On a Zen 5 EPYC int4pack's call took 0.75x q4_gemv's on the
# default model, and its eager step ran one stream at 143-154 tok/s against the one call's
# 258-267.
_ONE_ROW_LOSS = 1.5
# q4_gemv must lose to torch's int4 kernel by this much at some step size before both layouts
# are kept: the second layout costs 0.625 bytes a weight, nearly doubling the layers' memory
# (~500 MB on a 1B Q4_K_M, ~4 GB on a 7B), so it must buy about as much speed. On a Zen 5
# EPYC q4_gemv lost 2- to 64-row steps by 1.15-1.7x and one layout is kept.
_BOTH_LAYOUTS_LOSS = 2.0
_REPEATS = 3
_MIN_TIMED_S = 0.02
_MAX_CALLS = 100


@dataclass(slots=True)
class CpuPathPolicy:
    """Shared by every layer of one format: steps of at least `dequantize_from_rows` rows
    dequantize into `gemm_dtype` and run one GEMM (None: never); below that, steps of fewer
    than `native_below_rows` rows run our q4_gemv (`cpu_q4`), the others torch's int4 kernel;
    of q4_gemv's steps, those of at least `amx_from_rows` rows run q4_amx, and of q8_gemv's
    int8 pass (the vocabulary's), those of at least `int8_pass_amx_from_rows` q8_amx."""

    dequantize_from_rows: int | None = None
    gemm_dtype: torch.dtype = torch.float32
    native_below_rows: int = 0
    amx_from_rows: int = sys.maxsize
    int8_pass_amx_from_rows: int = sys.maxsize
    reason: str = "not calibrated"
    # Where steps that dequantize widen a layer: shared by the model's layers.
    workspace: DequantWorkspace = field(default_factory=lambda: DequantWorkspace(None))

    @property
    def runs_int4pack(self) -> bool:
        """Whether some step runs torch's int4 kernel, so its layout is built."""
        return self.native_below_rows < (self.dequantize_from_rows or sys.maxsize)


@dataclass(slots=True, frozen=True)
class RowTimings:
    """Seconds for one call at one row count; None where not timed."""

    int4pack: float
    q4: float | None = None
    fp32: float | None = None
    bf16: float | None = None
    amx: float | None = None


class CpuQuantizedMethod(Protocol):
    policy: CpuPathPolicy

    def kernel(self, x: torch.Tensor) -> torch.Tensor: ...
    def dequantized(self, dtype: torch.dtype) -> torch.Tensor: ...


class Kernel(Protocol):
    def kernel(self, x: torch.Tensor) -> torch.Tensor: ...


class NativeKernel(Kernel, Protocol):
    """q4_gemv's, which may have a kernel for many rows (q4_amx) to time as well."""

    @property
    def has_wide_call(self) -> bool: ...
    def wide_kernel(self, x: torch.Tensor) -> torch.Tensor: ...


def apply(method: CpuQuantizedMethod, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    threshold = method.policy.dequantize_from_rows
    if threshold is not None and x.shape[0] >= threshold:
        dtype = method.policy.gemm_dtype
        y = _dequantized_gemm(method, x.to(dtype)).to(x.dtype)
    else:
        y = method.kernel(x)
    return y if bias is None else y.add_(bias)


def calibrate(probe: CpuQuantizedMethod, max_rows: int,
              native: NativeKernel | None = None) -> CpuPathPolicy:
    """Time torch's int4 kernel (probe, built with a policy that keeps its dequantizing source
    and no q4_gemv layout), our q4_gemv on the same weight (native, where it loads) and
    dequantize-and-GEMM on one layer; the result is every layer of its format's policy."""
    rows = [r for r in CALIBRATION_ROWS if r <= max_rows] or [max_rows]
    policy = _policy_from_timings(_timings(probe, native, rows))
    policy.workspace = probe.policy.workspace
    if policy.dequantize_from_rows is None:
        policy.workspace.release()
    logger.info("CPU quantized linears: %s", policy.reason)
    return policy


def choose_int8_kernel(halves: Kernel, native: Kernel, in_features: int,
                       rows: list[int]) -> tuple[bool, str]:
    """(whether grouped int8 layers run q8_gemv, why), timed on one layer as its int4 halves
    (`split_int8`) and through q8_gemv at the step sizes that run a kernel. q8_gemv keeps 1.125
    bytes a weight resident where the halves keep 1.5, so it runs unless it loses some step
    size by more than _MIN_GAIN."""
    ratios = {}
    for m in rows:
        x = torch.randn(m, in_features)
        best = _best_times({"halves": partial(halves.kernel, x), "q8": partial(native.kernel, x)})
        ratios[m] = best["q8"] / best["halves"]
    table = ", ".join(f"{m} rows {r:.2f}x" for m, r in ratios.items())
    worst = max(ratios.values())
    chosen = worst <= _MIN_GAIN
    what = "q8_gemv" if chosen else "int4 halves"
    why = f"grouped int8 layers through {what} (q8_gemv's time / the halves': {table})"
    logger.info("CPU quantized linears: %s", why)
    return chosen, why


def choose_blocks_gemm_rows(method: CpuQuantizedMethod, in_features: int, rows: list[int],
                            dtype: torch.dtype) -> tuple[int | None, str]:
    """(from how many rows GGUF blocks read in place by q8_gemv (method) dequantize and run one
    GEMM at dtype, None: never; why), timed on one layer at the step sizes given. Their kernel
    is not int4's, so int4's threshold is not theirs: the super-block passes lose to the GEMM
    from far fewer rows than q4_gemv does."""
    timings = {}
    for m in (r for r in rows if r >= _GEMM_FROM_ROWS):
        x = torch.randn(m, in_features)
        best = _best_times({"kernel": partial(method.kernel, x),
                            "gemm": partial(_dequantized_gemm, method, x.to(dtype))})
        timings[m] = (best["kernel"], best["gemm"] * _MIN_GAIN)
    table = ", ".join(f"{m} rows {k * 1e3:.2f} / {g / _MIN_GAIN * 1e3:.2f} ms"
                      for m, (k, g) in timings.items())
    from_rows = _wins_from(timings) if timings else sys.maxsize
    threshold = None if from_rows == sys.maxsize else from_rows
    why = (f"GGUF blocks: {'GEMM from ' + str(threshold) + ' rows' if threshold else 'no GEMM'} "
           f"(kernel / {dtype} GEMM: {table})")
    logger.info("CPU quantized linears: %s", why)
    return threshold, why


def choose_amx_rows(native: NativeKernel, in_features: int, rows: list[int]) -> tuple[int, str]:
    """(from how many rows the kernel's wide call (AMX) runs, why), timed against its own
    narrow one at the step sizes given (from _AMX_FROM_ROWS)."""
    timings = {}
    for m in (r for r in rows if r >= _AMX_FROM_ROWS):
        x = torch.randn(m, in_features)
        best = _best_times({"narrow": partial(native.kernel, x),
                            "wide": partial(native.wide_kernel, x)})
        timings[m] = (best["narrow"], best["wide"])
    table = ", ".join(f"{m} rows {n * 1e3:.2f} / {w * 1e3:.2f} ms"
                      for m, (n, w) in timings.items())
    from_rows = _wins_from(timings)
    why = f"AMX from {from_rows} rows" if from_rows != sys.maxsize else "AMX never faster"
    return from_rows, f"{why} (narrow / AMX: {table})"


def second_wins_from(calls: dict[int, tuple[Callable[[], object], Callable[[], object]]],
                     ) -> tuple[int, dict[int, tuple[float, float]]]:
    """(the smallest size from which the second call beats the first at every larger one,
    sys.maxsize: none; each size's best times) for two ways to do one piece of work, timed as
    the paths above are (interleaved, best of several)."""
    timings = {}
    for size, (first, second) in calls.items():
        best = _best_times({"first": first, "second": second})
        timings[size] = (best["first"], best["second"])
    return _wins_from(timings), timings


def _wins_from(timings: dict[int, tuple[float, float]]) -> int:
    """The smallest row count from which the second time is below the first at every larger
    one (sys.maxsize: none)."""
    rows = sorted(timings)
    for i, m in enumerate(rows):
        if all(timings[r][1] < timings[r][0] for r in rows[i:]):
            return m
    return sys.maxsize


def _timings(probe: CpuQuantizedMethod, native: NativeKernel | None,
             rows: list[int]) -> dict[int, RowTimings]:
    k = probe.dequantized(torch.float32).shape[1]
    timings = {}
    for m in rows:
        x = torch.randn(m, k)
        calls: dict[str, Callable[[], object]] = {"int4pack": partial(probe.kernel, x)}
        if native is not None:
            calls["q4"] = partial(native.kernel, x)
            if native.has_wide_call and m >= _AMX_FROM_ROWS:
                calls["amx"] = partial(native.wide_kernel, x)
        if m >= _GEMM_FROM_ROWS or m == rows[-1]:
            calls["fp32"] = partial(_dequantized_gemm, probe, x)
            calls["bf16"] = partial(_dequantized_gemm, probe, x.bfloat16())
        timings[m] = RowTimings(**_best_times(calls))
    return timings


def _policy_from_timings(timings: dict[int, RowTimings]) -> CpuPathPolicy:
    """Which kernel runs each step size, and from which the dequantized GEMM does. The kernel
    is chosen over the step sizes that some kernel can keep from the GEMM."""
    table = "; ".join(f"{m} rows: {_row_table(t)}" for m, t in sorted(timings.items()))
    amx_from, amx_why = _amx_choice(timings)
    # From there on q4_gemv's steps are q4_amx's: its times are the native kernel's.
    timings = {m: replace(t, q4=t.amx) if m >= amx_from else t for m, t in timings.items()}
    best = {m: min(t.int4pack, t.q4 or t.int4pack) for m, t in timings.items()}
    reach = _dequantize_choice(timings, best)[0] or sys.maxsize
    native_below, why = _native_choice({m: t for m, t in timings.items() if m < reach})
    kernel = {m: t.q4 if m < native_below else t.int4pack for m, t in timings.items()}
    threshold, dtype, gemm_why = _dequantize_choice(timings, kernel)
    if threshold is not None and native_below >= threshold:
        native_below = sys.maxsize  # so no layer builds a layout that no step reads
    return CpuPathPolicy(threshold, dtype, native_below, amx_from_rows=amx_from,
                         reason=f"{why}; {amx_why}; {gemm_why} ({table})")


def _amx_choice(timings: dict[int, RowTimings]) -> tuple[int, str]:
    """(from how many rows q4_gemv's steps run q4_amx, why): the smallest timed count from
    which it is faster at every larger one. Its activations keep as many bits as q4_gemv's
    int16 ones, so speed alone decides."""
    pairs = {m: (t.q4, t.amx) for m, t in timings.items()
             if t.amx is not None and t.q4 is not None}
    if not pairs:
        return sys.maxsize, "no q4_amx"
    from_rows = _wins_from(pairs)
    if from_rows == sys.maxsize:
        return from_rows, "q4_amx slower than q4_gemv at the largest step sizes"
    return from_rows, f"q4_amx from {from_rows} rows"


def _native_choice(timings: dict[int, RowTimings]) -> tuple[int, str]:
    """(steps below how many rows q4_gemv runs, why).

    One layout where it can be: q4_gemv for every step if torch's kernel does not beat it by
    _ONE_ROW_LOSS at one-row steps and it does not lose the largest ones by more than
    _BOTH_LAYOUTS_LOSS; both kernels only where it does, PyTorch's from the step size where it
    starts winning for good."""
    rows = sorted(timings)
    if not rows or any(timings[m].q4 is None for m in rows):
        return 0, "torch's int4 kernel (q4_gemv unavailable)"
    first = timings[rows[0]]
    if first.int4pack * _ONE_ROW_LOSS < first.q4:
        return 0, f"torch's int4 kernel (it beats q4_gemv at {rows[0]}-row steps)"
    loss = {m: timings[m].q4 / timings[m].int4pack for m in rows}
    switch = next((m for i, m in enumerate(rows) if all(loss[r] > 1 for r in rows[i:])), None)
    if switch is None or max(loss[m] for m in rows if m >= switch) <= _BOTH_LAYOUTS_LOSS:
        worst = max(loss.values())
        return sys.maxsize, f"q4_gemv for every step (at worst {worst:.2f}x int4pack's time)"
    return switch, f"q4_gemv below {switch} rows, int4pack from there (both layouts)"


def _dequantize_choice(timings: dict[int, RowTimings], kernel: dict[int, float],
                       ) -> tuple[int | None, torch.dtype, str]:
    """Dequantize from the smallest row count at which, there and at every larger count, the
    weight-only kernel is slower than the faster GEMM dtype by _MIN_GAIN: only then is
    widening each layer worth it (and, where the kernel cannot widen its own layout, the extra
    copy of the weights: a 7B model's is 3.5 GB). bf16 runs where it beats fp32 at every one
    of those counts (a CPU with AVX512-BF16 or AMX), fp32 otherwise."""
    rows = sorted(m for m, t in timings.items() if t.fp32 is not None)
    for i, m in enumerate(rows):
        chosen = rows[i:]
        bf16 = all(timings[r].bf16 < timings[r].fp32 for r in chosen)
        gemm = {r: timings[r].bf16 if bf16 else timings[r].fp32 for r in chosen}
        if all(kernel[r] >= _MIN_GAIN * gemm[r] for r in chosen):
            dtype, name = (torch.bfloat16, "bf16") if bf16 else (torch.float32, "fp32")
            return m, dtype, f"{name} GEMM from {m} rows"
    return None, torch.float32, "no dequantized GEMM"


def _row_table(t: RowTimings) -> str:
    cells = [("int4pack", t.int4pack), ("q4_gemv", t.q4), ("q4_amx", t.amx),
             ("fp32 GEMM", t.fp32), ("bf16 GEMM", t.bf16)]
    return ", ".join(f"{name} {value * 1e3:.2f} ms" for name, value in cells if value is not None)


def _dequantized_gemm(method: CpuQuantizedMethod, x: torch.Tensor) -> torch.Tensor:
    return torch.nn.functional.linear(x, method.dequantized(x.dtype))


def _best_times(calls: dict[str, Callable[[], object]]) -> dict[str, float]:
    """Each call's best time, the calls interleaved, each made at least _REPEATS times and for
    _MIN_TIMED_S: on a shared machine one call can take ~20x its time (a thread of the team
    descheduled), and these timings decide which layouts every layer keeps."""
    for call in calls.values():
        call()
    best = dict.fromkeys(calls, float("inf"))
    spent = dict.fromkeys(calls, 0.0)
    for done in range(_MAX_CALLS):
        if done >= _REPEATS and min(spent.values()) >= _MIN_TIMED_S:
            break
        for name, call in calls.items():
            start = time.perf_counter()
            call()
            took = time.perf_counter() - start
            best[name], spent[name] = min(best[name], took), spent[name] + took
    return best
