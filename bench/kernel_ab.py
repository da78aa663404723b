"""A change to our C kernels, measured: a model's layer linears through this tree's kernels and
through a git revision's, in one process, in interleaved rounds.

Not a test: run it on a quiet machine before and after editing pagoda/kernels/cpu/, then note the table
where the change is described (docs/BENCHMARKS.md). Both builds multiply the same loaded weights
with the same arguments: one decode step's linears in the step's order, one activation row each,
so the weights come from memory as in a real step (a 1B model's layers are far larger than the
caches). Separate processes would differ by more than a few percent from each other on a
shared VM; rounds that alternate the builds put the machine's drift on both.

    .venv/bin/python bench/kernel_ab.py --model /tmp/pagoda-1b/llama-1b-random.Q4_K_M.gguf --base HEAD
"""

from __future__ import annotations

import argparse
import ctypes
import statistics
import subprocess
import tempfile
import time
from collections import defaultdict
from pathlib import Path

import torch
from cpu_info import cpu_name

from pagoda.engine import LLM
from pagoda.kernels.cpu import native
from pagoda.kernels.cpu.decode_layers import Q4_KIND, Q8_KIND, CLinear

KERNELS = ("q4_gemv", "q8_gemv")
# The entry points a layer's CLinear may hold, by kind (int16 activations, or int8).
ENTRY_POINTS = {Q4_KIND: ("q4_linear16", "q4_linear"), Q8_KIND: ("q8_linear16", "q8_linear")}


def build_revision(revision: str, out: Path) -> dict[str, ctypes.CDLL]:
    """pagoda/kernels/cpu's C sources at a git revision, compiled and loaded beside this tree's."""
    source = out / "src"
    source.mkdir()
    names = subprocess.run(["git", "ls-tree", "--name-only", f"{revision}:pagoda/kernels/cpu"],
                           check=True, capture_output=True, text=True).stdout.split()
    for name in names:
        if name.endswith((".c", ".h")):
            text = subprocess.run(["git", "show", f"{revision}:pagoda/kernels/cpu/{name}"], check=True,
                                  capture_output=True).stdout
            (source / name).write_bytes(text)
    return {name: native._open(native.build(name, out / "build", source_dir=source))
            for name in KERNELS}


def build_tree(out: Path) -> dict[str, ctypes.CDLL]:
    return {name: native._open(native.build(name, out / "build-tree")) for name in KERNELS}


def entry_name(linear: CLinear, engine_libs: dict[str, ctypes.CDLL]) -> str:
    """Which entry point of its library the engine chose for this linear."""
    lib = engine_libs["q4_gemv" if linear.kind == Q4_KIND else "q8_gemv"]
    for name in ENTRY_POINTS[linear.kind]:
        if ctypes.cast(getattr(lib, name), ctypes.c_void_p).value == linear.fn:
            return name
    raise ValueError(f"linear {linear} calls none of {ENTRY_POINTS[linear.kind]}")


def layer_linears(llm: LLM) -> list[tuple[str, CLinear]]:
    """(label, kernel) for every layer linear that runs one of our kernels, in step order."""
    found = []
    for layer in llm.engine.runner.model.layers:
        for label, linear in zip(("qkv", "o", "gate_up", "down"), layer.linears()):
            native_kernel = getattr(linear.method, "native", None)
            if native_kernel is not None and hasattr(native_kernel, "c_linear"):
                found.append((f"{label} {type(linear.method).__name__}", native_kernel.c_linear(1)))
    return found


def caller(lib: dict[str, ctypes.CDLL], name: str, linear: CLinear, x: torch.Tensor,
           threads: int):
    """A call of `name` in `lib` on the linear's weight: x [1, k] -> y [1, n]."""
    fn = getattr(lib["q4_gemv" if linear.kind == Q4_KIND else "q8_gemv"], name)
    fn.restype = ctypes.c_int
    y = torch.empty(1, linear.n)
    work = torch.empty(1 << 20, dtype=torch.uint8)  # larger than any row's quantized copy
    if linear.kind == Q4_KIND:
        args = (-1, ctypes.c_void_p(linear.weight), linear.format, linear.n, linear.k,
                ctypes.c_void_p(x.data_ptr()), 1, ctypes.c_void_p(y.data_ptr()),
                ctypes.c_void_p(work.data_ptr()), threads)
    else:
        args = (-1, ctypes.c_void_p(linear.weight), ctypes.c_void_p(linear.scales),
                ctypes.c_void_p(linear.mins), linear.format, linear.n, linear.k,
                ctypes.c_void_p(x.data_ptr()), 1, ctypes.c_void_p(y.data_ptr()),
                ctypes.c_void_p(work.data_ptr()), threads)

    def call(keep=(x, work)) -> torch.Tensor:  # the buffers live as long as the call
        if fn(*args):
            raise RuntimeError(f"{name} refused {linear}")
        return y
    return call


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", required=True, help="a GGUF file")
    parser.add_argument("--base", default="HEAD", help="the git revision to compare against")
    parser.add_argument("--rounds", type=int, default=20)
    args = parser.parse_args(argv)
    threads = torch.get_num_threads()
    llm = LLM(args.model)
    engine_libs = {name: next(lib for path, lib in native._loaded.items()
                              if path.name == f"lib{name}.so") for name in KERNELS}
    linears = layer_linears(llm)
    with tempfile.TemporaryDirectory() as tmp:
        builds = {"tree": build_tree(Path(tmp)), args.base: build_revision(args.base, Path(tmp))}
        xs = [torch.randn(1, linear.k) for _, linear in linears]
        calls = {variant: [(label, caller(lib, entry_name(linear, engine_libs), linear, x, threads))
                           for (label, linear), x in zip(linears, xs)]
                 for variant, lib in builds.items()}
        identical = True  # the same products from both builds (to fp32 rounding), or no table
        for step in calls.values():
            for (label, a), (_, b) in zip(calls["tree"], step):
                want, got = a().clone(), b()
                torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-3, msg=label)
                identical &= torch.equal(got, want)
        totals, by_label = defaultdict(list), defaultdict(list)
        for _ in range(args.rounds):
            for variant, step in calls.items():
                spent = defaultdict(float)
                for label, call in step:
                    start = time.perf_counter()
                    call()
                    spent[label] += time.perf_counter() - start
                totals[variant].append(sum(spent.values()))
                for label, seconds in spent.items():
                    by_label[variant, label].append(seconds)
    labels = sorted({label for label, _ in linears})
    print(f"CPU: {cpu_name()}, {threads} threads; {args.model}; one row, {len(linears)} layer "
          f"linears a step, {args.rounds} interleaved rounds; ms a step (median, best); "
          f"products {'bit-identical' if identical else 'equal to fp32 rounding'}\n")
    print("| build | " + " | ".join(labels) + " | all |")
    print("|---|" + "---|" * (len(labels) + 1))
    for variant in calls:
        cells = [f"{statistics.median(by_label[variant, label]) * 1e3:.2f}" for label in labels]
        total = totals[variant]
        cells.append(f"{statistics.median(total) * 1e3:.2f} ({min(total) * 1e3:.2f})")
        print(f"| {variant} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
