"""pagoda/kernels/cpu/q4_gemv.c (int8 activations x int4 weights) against the engine's int4 path and fp32.

Not a test: `python bench/q4_gemv.py` builds the C kernel with the system compiler, then prints
one table per layer shape of SmolLM2-135M: median µs per call and the weight bytes each kernel
reads per call turned into GB/s, each kernel cycling through 30 copies of the layer's weights
(as a decode step reads 30 layers, so they come from memory); each kernel's relative error on
16 rows with a few large channels against the product with the fp32 dequantized weights; and a
decode step's estimate, the 30 layers' four linears summed. Compare only within one run.

The weights' scales and mins are fp16 values, as in the default model's Q4_1 file, so q4_gemv
runs on both of its record formats: fp32 scales and mins, and "compact" fp16 ones. With
`--rounds N` every kernel is timed once per round, rounds interleaving the kernels (so another
process's burst lands on all of them alike), and each cell is the best round's.
"""

from __future__ import annotations

import argparse
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from cpu_info import cpu_name
from cpu_kernels import LAYERS, _activations, _timed

from pagoda.engine.quantization.cpu_int4 import CpuInt4Method
from pagoda.engine.quantization.cpu_paths import CpuPathPolicy
from pagoda.engine.quantization.tensors import (
    Int4Weight,
    dequantize,
    quantize_int4,
    with_compact_scales,
)
from pagoda.kernels.cpu.native import mapped_openmp_runtimes
from pagoda.kernels.cpu.q4_gemv import ISA_NAMES, Q4Gemv

# (name, outputs, inputs): a decode step's four linears per layer.
SHAPES = (("qkv", 960, 576), ("o", 576, 576), ("gate_up", 3072, 576), ("down", 576, 1536))
ERROR_ROWS = 16


@dataclass(slots=True)
class Kernel:
    """weight_bytes: what one call reads of one layer's weights; make(x) -> call on layer i."""

    weight_bytes: int
    make: Callable[[torch.Tensor], Callable[[int], object]]


def _q4_kernel(q4: Q4Gemv, weights: list[Int4Weight], threads: int,
               activations: str = "int8", compact: bool = False) -> Kernel:
    """activations: "int8" (one pass), "split" (high and low int8 parts,
    `Q4Gemv.linear_split`) or "int16" (`Q4Gemv.linear16`); compact: fp16 records."""
    repacked = [q4.repack(w.packed, w.scales, w.mins) if compact
                else q4.repack(w.packed, w.scales.float(), w.mins.float()) for w in weights]
    assert all(r.compact == compact for r in repacked)
    n = repacked[0].out_features

    def make(x: torch.Tensor) -> Callable[[int], object]:
        if activations == "split":
            return lambda i: q4.linear_split(repacked[i], x, threads=threads)
        if activations == "int16":
            return lambda i: q4.linear16(repacked[i], x, threads=threads)
        y, work = torch.empty(x.shape[0], n), q4.workspace(*x.shape)
        return lambda i: q4.linear_into(repacked[i], x, y, work, threads=threads)

    return Kernel(repacked[0].data.nbytes, make)


def _kernels(q4: Q4Gemv, float_w: list[torch.Tensor],
             threads: int) -> tuple[dict[str, Kernel], list[Int4Weight]]:
    weights = [_as_in_q4_1(quantize_int4(w)) for w in float_w]
    int4pack = [CpuInt4Method(w, CpuPathPolicy()) for w in weights]
    isa = ISA_NAMES[q4.best_isa()]
    kernels = {
        "F.linear fp32": Kernel(float_w[0].nbytes,
                                lambda x: (lambda i: F.linear(x, float_w[i]))),
        "int4pack (engine, bf16 in/out)": Kernel(
            int4pack[0].packed.nbytes + int4pack[0].scales_and_zeros.nbytes,
            lambda x: (lambda i: int4pack[i].kernel(x))),
        f"q4_gemv {isa}, 1 thread": _q4_kernel(q4, weights, 1),
    }
    if threads > 1:
        kernels[f"q4_gemv {isa}, {threads} threads"] = _q4_kernel(q4, weights, threads)
    kernels[f"q4_gemv {isa} compact, {threads} thr."] = _q4_kernel(q4, weights, threads,
                                                                 compact=True)
    kernels[f"q4_gemv {isa} split, {threads} thr."] = _q4_kernel(q4, weights, threads, "split")
    kernels[f"q4_gemv {isa} int16, {threads} thr."] = _q4_kernel(q4, weights, threads, "int16")
    kernels[f"q4_gemv {isa} int16 compact, {threads} thr."] = _q4_kernel(
        q4, weights, threads, "int16", compact=True)
    return kernels, weights


def _as_in_q4_1(weight: Int4Weight) -> Int4Weight:
    """Scales and mins rounded to fp16 and held so, as a Q4_1 file's are."""
    return with_compact_scales(Int4Weight(weight.packed, weight.scales.half().float(),
                                          weight.mins.half().float(), weight.group_size))


def _relative_error(kernel: Kernel, weight: Int4Weight) -> float:
    """Against the fp32 product with the same int4 weights, dequantized: what is left is the
    kernel's own rounding (int8 or bf16 activations)."""
    x = _activations(ERROR_ROWS, weight.shape[1])
    want = F.linear(x, dequantize(weight, torch.float32))
    got = kernel.make(x)(0)
    return ((got.float() - want).norm() / want.norm()).item()


def _measure_shape(q4: Q4Gemv, n: int, k: int, rows: list[int], repeats: int,
                   threads: int, rounds: int, only: str) -> dict[str, list[float]]:
    float_w = [torch.randn(n, k) * 0.05 for _ in range(LAYERS)]
    kernels, weights = _kernels(q4, float_w, threads)
    kernels = {name: kernel for name, kernel in kernels.items() if only in name}
    calls = {name: [kernel.make(_activations(m, k)) for m in rows]
             for name, kernel in kernels.items()}
    times = {name: [float("inf")] * len(rows) for name in kernels}
    for _ in range(rounds):
        for name in kernels:
            times[name] = [min(best, _timed(call, repeats))
                           for best, call in zip(times[name], calls[name])]
    for name, kernel in kernels.items():
        cells = " |".join(f"{t:9.1f} ({kernel.weight_bytes / t / 1e3:5.1f})" for t in times[name])
        # fp32 F.linear uses the float weights, so its error is the int4 rounding's size.
        error = _relative_error(kernel, weights[0]) if "fp32" not in name else float("nan")
        print(f"  {name:36s}{cells} | {error:9.5f}", flush=True)
    return times


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=int, nargs="+", default=[1, 4, 16])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--only", default="", help="only the kernels whose name holds this")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    q4 = Q4Gemv.load(Path(tempfile.mkdtemp(prefix="q4_gemv_")))
    print(f"CPU: {cpu_name()}, torch {torch.__version__} ({args.threads} threads, capability "
          f"{torch.backends.cpu.get_cpu_capability()}), q4_gemv path {ISA_NAMES[q4.best_isa()]}")
    print(f"OpenMP runtimes mapped: {sorted(mapped_openmp_runtimes())}")
    print("median µs per call (weight GB/s); rel. error at 16 rows vs the dequantized fp32 product")
    step: dict[str, list[float]] = {}
    for name, n, k in SHAPES:
        print(f"\n{name} {k}->{n}: " + " | ".join(f"{m:>10} rows" for m in args.rows)
              + " | rel. error")
        for kernel, times in _measure_shape(q4, n, k, args.rows, args.repeats, args.threads,
                                            args.rounds, args.only).items():
            step[kernel] = [a + LAYERS * t for a, t in zip(step.get(kernel, [0.0] * len(times)),
                                                           times)]
    print(f"\nOne decode step's linears ({LAYERS} layers x {len(SHAPES)}), ms: "
          + " | ".join(f"{m} rows" for m in args.rows))
    for kernel, total in step.items():
        print(f"  {kernel:36s}" + " |".join(f"{t / 1e3:8.2f}" for t in total))
    print(f"\nOpenMP runtimes mapped after the run: {sorted(mapped_openmp_runtimes())}")


if __name__ == "__main__":
    main()
