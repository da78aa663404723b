"""One mixture-of-experts layer's routed experts for a step, at Qwen3-30B-A3B's widths (hidden
2048, 128 experts, 8 active, expert width 768, Q4_K blocks as a Q4_K_M file holds them): the
in-place kernel (kernels/cpu/moe_experts.c through `CpuExpertsMethod`) beside the default
grouped method (each active expert once on its rows, through the linear methods on the experts'
decoded int4 layout: q4_gemv where it loads, else torch's int4 kernel).

Not a test: run it on a quiet machine, then copy the table into docs/KERNELS.md.

    .venv/bin/python bench/moe_experts.py [--rows 1 8] [--rounds 5] [--experts 128]

Each call gets another random routing (of ROUTINGS, cycled), so the experts it reads come from
memory as a decode step's do (one layer's 128 experts are 340 MB). GB/s: the bytes of the
distinct experts a call reads (gate, up and down blocks), over its best time (a shared
machine's median is its neighbours' as much as ours; both are printed).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from dataclasses import replace

import numpy as np
import torch
from cpu_info import cpu_name

from engine.layers.linear import Placement, make_fused_linear, make_linear
from engine.layers.moe import (
    Expert,
    ExpertActivation,
    ExpertWeights,
    GroupedExperts,
)
from engine.quantization.cpu_experts import in_place_experts
from engine.quantization.cpu_paths import CpuPathPolicy
from engine.quantization.cpu_q4 import load_q4_context
from engine.quantization.expert_weights import expert_weight
from kernels.kernel_ops import TORCH_OPS

HIDDEN, WIDTH, TOP_K = 2048, 768, 8
Q4_K_BYTES = 144
ROUTINGS = 16


def random_q4_k(rows: int, cols: int, rng: np.random.Generator) -> np.ndarray:
    """Random Q4_K rows: random nibbles, scales and mins, small fp16 d and dmin."""
    blocks = rng.integers(0, 256, size=(rows, cols // 256, Q4_K_BYTES), dtype=np.uint8)
    for at in (0, 2):
        d = rng.uniform(1e-3, 4e-3, size=blocks.shape[:2]).astype(np.float16)
        blocks[..., at:at + 2] = d[..., None].view(np.uint8)
    return blocks.reshape(rows, -1)


def experts(count: int) -> list[ExpertWeights]:
    rng = np.random.default_rng(0)
    return [ExpertWeights(*(expert_weight(random_q4_k(n, k, rng), "Q4_K")
                            for n, k in ((WIDTH, HIDDEN), (WIDTH, HIDDEN), (HIDDEN, WIDTH))))
            for _ in range(count)]


def grouped(weights: list[ExpertWeights]) -> GroupedExperts:
    """The default method as the engine builds it on this CPU (q4_gemv for every step where
    it loads)."""
    q4 = load_q4_context()
    placement = Placement(torch.device("cpu"), torch.float32, TORCH_OPS,
                          cpu_int4_policy=CpuPathPolicy(native_below_rows=sys.maxsize), q4=q4)
    if q4 is None:
        placement = replace(placement, cpu_int4_policy=CpuPathPolicy())
    built = [Expert(make_fused_linear([w.gate, w.up], None, placement),
                    make_linear(w.down, None, placement)) for w in weights]
    return GroupedExperts(built, ExpertActivation(), TORCH_OPS)


def time_method(method, rows: int, count: int, rounds: int) -> tuple[float, float, float]:
    """(best and median seconds a call, median bytes a call reads)."""
    g = torch.Generator().manual_seed(rows)
    steps = []
    for _ in range(ROUTINGS):
        ids = torch.stack([torch.randperm(count, generator=g)[:TOP_K] for _ in range(rows)])
        weights = torch.softmax(torch.randn(rows, TOP_K, generator=g), dim=-1)
        steps.append((torch.randn(rows, HIDDEN, generator=g), weights, ids))
    expert_bytes = 3 * WIDTH * HIDDEN // 256 * Q4_K_BYTES
    method.apply(*steps[0])
    times, reads = [], []
    for _ in range(rounds):
        for x, weights, ids in steps:
            start = time.perf_counter()
            method.apply(x, weights, ids)
            times.append(time.perf_counter() - start)
            reads.append(len(set(ids.flatten().tolist())) * expert_bytes)
    return min(times), statistics.median(times), statistics.median(reads)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, nargs="+", default=[1, 8])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--experts", type=int, default=128)
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    weights = experts(args.experts)
    methods = {"moe_experts (in place)": in_place_experts(weights, "silu")}
    if methods["moe_experts (in place)"] is None:
        raise SystemExit("kernels/cpu/moe_experts.c did not build here")
    start = time.perf_counter()
    methods["grouped (decoded)"] = grouped(weights)
    print(f"{cpu_name()}, {args.threads} threads; {args.experts} Q4_K experts "
          f"({HIDDEN} x {WIDTH}), top {TOP_K}; grouped method built in "
          f"{time.perf_counter() - start:.1f} s")
    print("| rows | method | ms a call, best | median | MB read | GB/s (best) |")
    print("|---|---|---|---|---|---|")
    for rows in args.rows:
        for name, method in methods.items():
            best, median, read = time_method(method, rows, args.experts, args.rounds)
            print(f"| {rows} | {name} | {best * 1e3:.2f} | {median * 1e3:.2f} | "
                  f"{read / 1e6:.1f} | {read / best / 1e9:.1f} |", flush=True)


if __name__ == "__main__":
    main()
