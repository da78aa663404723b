"""A change to the one-row linear kernels, measured on random weights at a model's shapes: this
tree's q4_gemv and q8_gemv against a git revision's, in one process, interleaved rounds.

Not a test: run it on a quiet machine before and after editing pagoda/kernels/cpu/ (for a model
file's own linears in a decode step's order, bench/kernel_ab.py). Each shape is cycled over
enough copies that its calls read from memory, as a decode step does; Q4_K records come from
`repack_kq` and Q6_K rows are GGUF's own bytes, both in huge pages as the engine keeps them.

    .venv/bin/python bench/kernel_ab_random.py --base HEAD [--threads 2] [--rounds 20]
"""

from __future__ import annotations

import argparse
import ctypes
import statistics
import tempfile
import time
from pathlib import Path

import torch
from cpu_info import cpu_name
from kernel_ab import build_revision, build_tree

from pagoda.engine.quantization.native_kernels import load_native
from pagoda.kernels.cpu.huge_pages import huge_page_empty
from pagoda.kernels.cpu.q4_gemv import Q4Gemv
from pagoda.kernels.cpu.q8_gemv import Q6_K_BLOCK_BYTES, Q6_K_SUPER_BLOCK, Q8Gemv

# (label, kernel library, entry point, n, k, copies): a Qwen3.5-9B-shaped layer's Q4_K
# matrices and its Q4_K_M file's Q6_K ones, the vocabulary's Q6_K in its int8 pass.
SHAPES = [
    ("Q4_K gate_up 24576x4096", "q4_gemv", "q4_linear16", 24576, 4096, 3),
    ("Q4_K down 4096x12288", "q4_gemv", "q4_linear16", 4096, 12288, 6),
    ("Q4_K o 4096x4096", "q4_gemv", "q4_linear16", 4096, 4096, 16),
    ("Q6_K down 4096x12288", "q8_gemv", "q8_linear16", 4096, 12288, 4),
    ("Q6_K qkv 8192x4096", "q8_gemv", "q8_linear16", 8192, 4096, 6),
    ("Q6_K vocabulary 49152x4096", "q8_gemv", "q8_linear", 49152, 4096, 1),
]


def q4_k_records(q4: Q4Gemv, n: int, k: int):
    packed = torch.randint(0, 256, (n, k // 2), dtype=torch.uint8)
    d, dmin = ((torch.rand(n, k // 256) * 1e-2).half() for _ in range(2))
    sc, m = (torch.randint(0, 64, (n, k // 32), dtype=torch.uint8) for _ in range(2))
    w = q4.repack_kq(packed, d, dmin, sc, m)
    return (w.data.data_ptr(), w.record_format), w.data.numel(), w


def q6_k_rows(n: int, k: int):
    rows = torch.randint(0, 256, (n, k // Q6_K_SUPER_BLOCK, Q6_K_BLOCK_BYTES), dtype=torch.uint8)
    rows[..., -2:] = torch.tensor([0x00, 0x20], dtype=torch.uint8)  # d: a small fp16
    kept = huge_page_empty((n, rows.shape[1] * Q6_K_BLOCK_BYTES), torch.uint8)
    kept.copy_(rows.view(n, -1))
    w = Q8Gemv.q6_k_operand(kept)
    return w.pointers, kept.numel(), w


def call(lib: ctypes.CDLL, entry: str, weight_args: tuple, n: int, k: int, x: torch.Tensor,
         y: torch.Tensor, work: torch.Tensor, threads: int) -> None:
    fn = getattr(lib, entry)
    fn.restype = ctypes.c_int
    ptr = ctypes.c_void_p
    if entry.startswith("q4"):
        q, fmt = weight_args
        args = (-1, ptr(q), fmt, n, k, ptr(x.data_ptr()), 1, ptr(y.data_ptr()),
                ptr(work.data_ptr()), threads)
    else:
        q, scales, mins, halves = weight_args
        args = (-1, ptr(q), ptr(scales), ptr(mins), halves, n, k, ptr(x.data_ptr()), 1,
                ptr(y.data_ptr()), ptr(work.data_ptr()), threads)
    if fn(*args):
        raise RuntimeError(f"{entry} refused its arguments ({n} x {k})")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--base", default="HEAD", help="the git revision to compare against")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=20)
    args = parser.parse_args(argv)
    q4 = Q4Gemv(load_native("q4_gemv"))
    weights = {}
    for label, _, _, n, k, copies in SHAPES:
        made = [q4_k_records(q4, n, k) if label.startswith("Q4_K") else q6_k_rows(n, k)
                for _ in range(copies)]
        weights[label] = made
    work = torch.empty(1 << 22, dtype=torch.uint8)
    times: dict[tuple[str, str], list[float]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        builds = {"tree": build_tree(Path(tmp)), args.base: build_revision(args.base, Path(tmp))}
        for _ in range(args.rounds):
            for build, libs in builds.items():
                for label, kernel, entry, n, k, _ in SHAPES:
                    x, y = torch.randn(1, k), torch.empty(1, n)
                    start = time.perf_counter()
                    for weight_args, _, _ in weights[label]:
                        call(libs[kernel], entry, weight_args, n, k, x, y, work, args.threads)
                    spent = (time.perf_counter() - start) / len(weights[label])
                    times.setdefault((build, label), []).append(spent)
    print(f"CPU: {cpu_name()}, {args.threads} threads, one row, {args.rounds} interleaved "
          f"rounds; ms a call, median (best), GB/s of the weight's bytes by the median\n")
    print("| matrix | " + " | ".join(builds) + " |")
    print("|---|" + "---|" * len(builds))
    for label, *_ in SHAPES:
        mb = weights[label][0][1] / 1e6
        cells = []
        for build in builds:
            t = times[build, label]
            median = statistics.median(t)
            cells.append(f"{median * 1e3:.3f} ({min(t) * 1e3:.3f}), {mb / 1e3 / median:.1f} GB/s")
        print(f"| {label} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
