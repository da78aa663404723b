"""The recurrent layers' one-token state updates: the fused C kernels
(pagoda/kernels/cpu/recurrent_steps.c) against their torch versions, at real widths, alternating.

    python bench/recurrent_steps.py [--threads 2] [--rounds 5]

Gated DeltaNet at Qwen3.5-9B's widths (16 key heads, 32 value heads of 128: a 2 MB state per
sequence and layer) and Mamba-2 at Granite 4.0-H-Tiny's (48 heads of 64, state 128, one
group), 1 and 8 sequences; microseconds per layer step, medians.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import torch
from cpu_info import cpu_name

from pagoda.kernels import recurrent_steps as torch_steps
from pagoda.kernels.cpu.recurrent_steps import RecurrentSteps

SLOTS = 16


def gdn_case(batch: int):
    state = torch.randn(SLOTS, 32, 128, 128) * 0.01
    q, k = torch.randn(batch, 16, 128) * 0.05, torch.randn(batch, 16, 128) * 0.05
    v = torch.randn(batch, 32, 128)
    g, beta = -torch.rand(batch, 32), torch.rand(batch, 32)
    return state, (torch.arange(batch) * 2, q, k, v, g, beta)


def mamba2_case(batch: int):
    state = torch.randn(SLOTS, 48, 64, 128) * 0.01
    x, dt = torch.randn(batch, 48, 64), torch.rand(batch, 48) * 0.1
    a, d = -torch.rand(48), torch.randn(48)
    b, c = torch.randn(batch, 1, 128), torch.randn(batch, 1, 128)
    return state, (torch.arange(batch) * 2, x, dt, a, b, c, d)


def timed(fn, state, args, repeats: int = 50) -> float:
    fn(state, *args)
    start = time.perf_counter()
    for _ in range(repeats):
        fn(state, *args)
    return (time.perf_counter() - start) / repeats * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    with tempfile.TemporaryDirectory() as build:
        c = RecurrentSteps.load(Path(build))
        kernels = {"gdn": (gdn_case, torch_steps.gdn_step, c.gdn_step),
                   "mamba2": (mamba2_case, torch_steps.mamba2_step, c.mamba2_step)}
        print(f"{cpu_name()}, {args.threads} threads; µs per layer step, median of "
              f"{args.rounds} rounds")
        print("| layer | sequences | torch | C | C speed-up |\n|---|---|---|---|---|")
        for name, (case, torch_fn, c_fn) in kernels.items():
            for batch in (1, 8):
                state, inputs = case(batch)
                runs = {"torch": [], "C": []}
                for _ in range(args.rounds):
                    runs["torch"].append(timed(torch_fn, state, inputs))
                    runs["C"].append(timed(c_fn, state, inputs))
                t, n = (statistics.median(runs[k]) for k in ("torch", "C"))
                print(f"| {name} | {batch} | {t:,.0f} | {n:,.0f} | {t / n:.2f}x |")


if __name__ == "__main__":
    main()
