"""One mixture-of-experts layer's routed experts for a step, at Qwen3-30B-A3B's widths (hidden
2048, 128 experts, 8 active, expert width 768, Q4_K blocks as a Q4_K_M file holds them, or
`--down-kind Q6_K` for the down experts a Q4_K_M keeps in Q6_K in some layers) or
gpt-oss-20b's (`--shape gpt-oss-20b`: hidden and width 2880, 32 experts, 4 active, MXFP4,
its clamped SwiGLU): the in-place kernel (pagoda/kernels/cpu/moe_experts.c through `CpuExpertsMethod`) beside the default
grouped method (each active expert once on its rows, through the linear methods on the experts'
decoded int4 layout: q4_gemv where it loads, else torch's int4 kernel) and, with `--against
REV`, beside the kernel as git revision REV had it (built here, timed in the same run: a
shared machine's speed drifts between runs).

Not a test: run it on a quiet machine, then copy the table into docs/KERNELS.md.

    .venv/bin/python bench/moe_experts.py [--shape qwen3-30b-a3b] [--down-kind Q6_K]
                                          [--rows 1 8] [--rounds 5] [--experts N]
                                          [--threads N] [--no-grouped] [--against REV]

Each call gets another random routing (of ROUTINGS, cycled), so the experts it reads come from
memory as a decode step's do (one layer's 128 Q4_K experts are 340 MB). The methods take turns
a round each. GB/s: the bytes of the distinct experts a call reads (gate, up and down blocks),
over its best time (a shared machine's median is its neighbours' as much as ours; both are
printed).
"""

from __future__ import annotations

import argparse
import ctypes
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import torch
from cpu_info import cpu_name

from pagoda.engine.layers.linear import Placement, make_fused_linear, make_linear
from pagoda.engine.layers.moe import (
    Expert,
    ExpertActivation,
    ExpertWeights,
    GroupedExperts,
)
from pagoda.engine.quantization.cpu_experts import CpuExpertsMethod, in_place_experts
from pagoda.engine.quantization.cpu_paths import CpuPathPolicy
from pagoda.engine.quantization.cpu_q4 import load_q4_context
from pagoda.engine.quantization.expert_weights import expert_weight
from pagoda.kernels.cpu import native
from pagoda.kernels.cpu.moe_experts import MoeExperts, Projection
from pagoda.kernels.kernel_ops import TORCH_OPS

ROUTINGS = 16
ROOT = Path(__file__).resolve().parent.parent


@dataclass(frozen=True)
class Shape:
    hidden: int
    width: int
    experts: int
    top_k: int
    kind: str
    activation: ExpertActivation


SHAPES = {
    "qwen3-30b-a3b": Shape(2048, 768, 128, 8, "Q4_K", ExpertActivation()),
    "gpt-oss-20b": Shape(2880, 2880, 32, 4, "MXFP4",
                         ExpertActivation("swiglu_oai", limit=7.0, alpha=1.702)),
}
# (values, bytes) a block
BLOCKS = {"Q4_K": (256, 144), "Q6_K": (256, 210), "MXFP4": (32, 17)}
# where a type's fp16 scales are in its block
FP16_AT = {"Q4_K": (0, 2), "Q6_K": (208,), "MXFP4": ()}


def random_blocks(kind: str, rows: int, cols: int, rng: np.random.Generator) -> np.ndarray:
    """Random rows: random codes, scales and mins; the K-quants' fp16 d (and dmin) small,
    MXFP4's exponents 2^-8..2^-3."""
    values, size = BLOCKS[kind]
    blocks = rng.integers(0, 256, size=(rows, cols // values, size), dtype=np.uint8)
    if kind == "MXFP4":
        blocks[..., 0] = rng.integers(120, 126, size=blocks.shape[:2], dtype=np.uint8)
    for at in FP16_AT[kind]:
        d = rng.uniform(1e-3, 4e-3, size=blocks.shape[:2]).astype(np.float16)
        blocks[..., at:at + 2] = d[..., None].view(np.uint8)
    return blocks.reshape(rows, -1)


def experts(shape: Shape, count: int, down_kind: str) -> list[ExpertWeights]:
    rng = np.random.default_rng(0)
    sizes = ((shape.width, shape.hidden, shape.kind), (shape.width, shape.hidden, shape.kind),
             (shape.hidden, shape.width, down_kind))
    return [ExpertWeights(*(expert_weight(random_blocks(kind, n, k, rng), kind)
                            for n, k, kind in sizes)) for _ in range(count)]


def kernel_at(rev: str) -> MoeExperts:
    """pagoda/kernels/cpu/moe_experts.c as git revision rev had it (with its headers), built with the
    flags the engine builds it with."""
    folder = Path(tempfile.mkdtemp(prefix="moe_experts_"))
    tree = subprocess.run(["git", "archive", rev, "pagoda/kernels/cpu"], cwd=ROOT, check=True,
                          capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", str(folder)], input=tree, check=True)
    compiler, source = native.find_compiler(), folder / "pagoda/kernels/cpu/moe_experts.c"
    subprocess.run([compiler, *native.COMPILE_FLAGS, "-c", str(source), "-o",
                    str(folder / "moe.o")], check=True)
    subprocess.run([compiler, "-shared", str(folder / "moe.o"), "-o", str(folder / "moe.so"),
                    "-lm"], check=True)
    # torch's OpenMP runtime is loaded already (in_place_experts loaded ours first)
    return MoeExperts(ctypes.CDLL(str(folder / "moe.so")))


def kernel_method(kernel: MoeExperts, weights: list[ExpertWeights],
                  activation: ExpertActivation) -> CpuExpertsMethod:
    projections = [Projection([getattr(w, name).blocks for w in weights],
                              getattr(weights[0], name).type_name)
                   for name in ("gate", "up", "down")]
    return CpuExpertsMethod(kernel, kernel.layer(*projections, activation=activation.name,
                                                 limit=activation.limit or 0.0,
                                                 alpha=activation.alpha or 0.0))


def grouped(weights: list[ExpertWeights], activation: ExpertActivation) -> GroupedExperts:
    """The default method as the engine builds it on this CPU (q4_gemv for every step where
    it loads)."""
    q4 = load_q4_context()
    placement = Placement(torch.device("cpu"), torch.float32, TORCH_OPS,
                          cpu_int4_policy=CpuPathPolicy(native_below_rows=sys.maxsize), q4=q4)
    if q4 is None:
        placement = replace(placement, cpu_int4_policy=CpuPathPolicy())
    built = [Expert(make_fused_linear([w.gate, w.up], None, placement),
                    make_linear(w.down, None, placement)) for w in weights]
    return GroupedExperts(built, activation, TORCH_OPS)


def time_methods(methods: dict, shape: Shape, rows: int, count: int, rounds: int,
                 expert_bytes: int) -> dict[str, tuple[float, float, float]]:
    """Per method: (best and median seconds a call, median bytes a call reads); the methods
    take turns a round each."""
    g = torch.Generator().manual_seed(rows)
    steps = []
    for _ in range(ROUTINGS):
        ids = torch.stack([torch.randperm(count, generator=g)[:shape.top_k]
                           for _ in range(rows)])
        weights = torch.softmax(torch.randn(rows, shape.top_k, generator=g), dim=-1)
        steps.append((torch.randn(rows, shape.hidden, generator=g), weights, ids))
    times = {name: [] for name in methods}
    reads = [len(set(ids.flatten().tolist())) * expert_bytes for _, _, ids in steps]
    for method in methods.values():
        method.apply(*steps[0])
    for _ in range(rounds):
        for name, method in methods.items():
            for x, weights, ids in steps:
                start = time.perf_counter()
                method.apply(x, weights, ids)
                times[name].append(time.perf_counter() - start)
    return {name: (min(t), statistics.median(t), statistics.median(reads))
            for name, t in times.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shape", choices=SHAPES, default="qwen3-30b-a3b")
    parser.add_argument("--down-kind", choices=BLOCKS, help="the down experts' type (default: "
                        "the shape's)")
    parser.add_argument("--rows", type=int, nargs="+", default=[1, 8])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--experts", type=int, help="fewer experts than the model's")
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    parser.add_argument("--no-grouped", action="store_true", help="the kernel alone")
    parser.add_argument("--against", metavar="REV", help="also the kernel as git revision REV "
                        "had it, e.g. HEAD~3")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    shape = SHAPES[args.shape]
    down_kind = args.down_kind or shape.kind
    if BLOCKS[down_kind][0] % 32 or shape.width % BLOCKS[down_kind][0]:
        raise SystemExit(f"{down_kind} blocks do not tile the width {shape.width}")
    count = args.experts or shape.experts
    weights = experts(shape, count, down_kind)
    act = shape.activation
    methods = {"moe_experts (in place)": in_place_experts(weights, act.name, act.limit,
                                                          act.alpha)}
    if methods["moe_experts (in place)"] is None:
        raise SystemExit("pagoda/kernels/cpu/moe_experts.c did not build here")
    if args.against:
        methods[f"moe_experts at {args.against}"] = kernel_method(kernel_at(args.against),
                                                                  weights, act)
    start = time.perf_counter()
    if not args.no_grouped:
        methods["grouped (decoded)"] = grouped(weights, act)
    print(f"{cpu_name()}, {args.threads} threads; {count} {shape.kind} experts "
          f"({shape.hidden} x {shape.width}, down {down_kind}), top {shape.top_k}; grouped "
          f"method built in {time.perf_counter() - start:.1f} s")
    expert_bytes = sum(getattr(weights[0], name).blocks.numel() for name in ("gate", "up", "down"))
    print("| rows | method | ms a call, best | median | MB read | GB/s (best) |")
    print("|---|---|---|---|---|---|")
    for rows in args.rows:
        timed = time_methods(methods, shape, rows, count, args.rounds, expert_bytes)
        for name, (best, median, read) in timed.items():
            print(f"| {rows} | {name} | {best * 1e3:.2f} | {median * 1e3:.2f} | "
                  f"{read / 1e6:.1f} | {read / best / 1e9:.1f} |", flush=True)


if __name__ == "__main__":
    main()
