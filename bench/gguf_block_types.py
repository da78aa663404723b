"""q8_gemv on GGUF IQ4_XS, Q5_K and Q3_K blocks read in place, against the same layers widened
to grouped int8 at load (what the engine did before), side by side in one process.

Not a test: run it on a quiet machine and copy the tables into docs/BENCHMARKS.md. FILE is a
1B-shaped file from `python bench/llama_1b_file.py --type IQ4_XS --type Q5_K_M ...`.

    .venv/bin/python bench/gguf_block_types.py kernels FILE ...  # one row, a layer's matrices
    .venv/bin/python bench/gguf_block_types.py kernels random    # the same at 1B shapes, random bits
    .venv/bin/python bench/gguf_block_types.py engine FILE       # one stream decode tok/s

`kernels`: per block type in the file and matrix (ffn_gate, ffn_up, ffn_down, attn_q ...), µs
per call of one row with int16 activations (as layers run), best and median of interleaved
rounds, each path cycling through every layer's matrix of that name and type (together larger
than the caches, as a decode step reads them; `random`: random blocks at TinyLlama 1.1B's shapes,
as many copies as exceed 100 MB). `engine`: two engines over the file, one
reading the blocks in place and one with them widened to grouped int8 as before, in
interleaved rounds of one `LLM.chat` of greedy tokens with `ignore_eos`.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections import defaultdict
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import gguf
import numpy as np
import torch
from cpu_info import cpu_name
from q8_gemv import chat_rounds

from pagoda.engine.quantization.native_kernels import load_native
from pagoda.engine.quantization.tensors import (
    BlockWeight,
    IQ4XSWeight,
    Q3KWeight,
    Q5KWeight,
    widen_blocks,
)
from pagoda.kernels.cpu.q8_gemv import Q8Gemv

KINDS = {kind.TYPE_NAME: kind for kind in (IQ4XSWeight, Q5KWeight, Q3KWeight)}
# TinyLlama 1.1B's layer matrices (out x in).
SHAPES = {"attn_q": (2048, 2048), "ffn_gate": (5632, 2048), "ffn_down": (2048, 5632)}
RANDOM_BYTES = 100 << 20
PATHS = ("in place", "widened")


def _matrices(path: Path) -> dict[tuple[str, str], list[BlockWeight]]:
    """(type, matrix name) -> every layer's matrix of that name held in that type."""
    found: dict[tuple[str, str], list[BlockWeight]] = defaultdict(list)
    for tensor in gguf.GGUFReader(path).tensors:
        kind = tensor.tensor_type.name
        if kind in KINDS and tensor.name.startswith("blk."):
            blocks = torch.from_numpy(np.array(tensor.data, dtype=np.uint8))
            found[kind, tensor.name.split(".")[2]].append(KINDS[kind](blocks))
    return found


def _random_matrices() -> Iterator[tuple[tuple[str, str], list[BlockWeight]]]:
    """Random bits with every fp16 scale set to 2^-10 (any bits are valid blocks), one
    (type, matrix) at a time."""
    rng = np.random.default_rng(0)
    for kind, cls in KINDS.items():
        d_at = {"IQ4_XS": (0,), "Q5_K": (0, 2), "Q3_K": (108,)}[kind]
        for name, (n, k) in SHAPES.items():
            size = k // 256 * cls.BLOCK_BYTES
            copies = max(4, RANDOM_BYTES // (n * size))
            weights = []
            for _ in range(copies):
                blocks = rng.integers(0, 256, size=(n, k // 256, cls.BLOCK_BYTES), dtype=np.uint8)
                for at in d_at:
                    blocks[..., at:at + 2] = np.array([2 ** -10], dtype=np.float16).view(np.uint8)
                weights.append(cls(torch.from_numpy(blocks.reshape(n, size))))
            yield (kind, name), weights


def _operands(q8: Q8Gemv, weights: list[BlockWeight]) -> dict[str, list]:
    widened = [widen_blocks(w) for w in weights]
    return {
        "in place": [Q8Gemv.blocks_operand(w.blocks, w.TYPE_NAME) for w in weights],
        "widened": [Q8Gemv.operand(w.q, w.scales, w.mins) for w in widened],
    }


def bench_kernels(files: list[Path], rounds: int, threads: int) -> None:
    q8 = Q8Gemv(load_native("q8_gemv"))
    torch.set_num_threads(threads)
    print(f"CPU: {cpu_name()}, {threads} threads, one row, int16 activations\n")
    print("| type | matrix (out x in) | path | MB a call | µs (best) | µs (median) | GB/s (best) |")
    print("|---|---|---|---|---|---|---|")
    for path in files:
        matrices = _random_matrices() if str(path) == "random" else _matrices(path).items()
        for (kind, name), weights in matrices:
            operands = _operands(q8, weights)
            n, k = weights[0].shape
            x = torch.randn(1, k)
            times: dict[str, list[float]] = {p: [] for p in PATHS}
            for _ in range(rounds):
                for p in PATHS:
                    start = time.perf_counter()
                    for operand in operands[p]:
                        q8.linear(operand, x, threads=threads, wide=True)
                    times[p].append((time.perf_counter() - start) / len(operands[p]) * 1e6)
            for p in PATHS:
                o = operands[p][0]
                parts = [o.q, *(t for t in (o.scales, o.mins) if t is not None)]
                mb = sum(t.numel() * t.element_size() for t in parts) / 1e6
                best, median = min(times[p]), statistics.median(times[p])
                print(f"| {kind} | {name} {n}x{k} | {p} | {mb:.2f} | {best:.0f} | {median:.0f} "
                      f"| {mb * 1e3 / best:.1f} |", flush=True)


@contextmanager
def _path(name: str):
    """The blocks read in place, or widened to grouped int8 where each layer is built."""
    from pagoda.engine.layers import linear

    runs = linear._runs_blocks
    if name == "widened":
        linear._runs_blocks = lambda placement: False
    try:
        yield
    finally:
        linear._runs_blocks = runs


def bench_engine(path: Path, rounds: int, max_tokens: int) -> None:
    from pagoda.engine import LLM, EngineConfig, LLMEngine, SamplingParams
    from pagoda.engine.loading.loader import load_model

    print(f"CPU: {cpu_name()}, {path.name}\n")
    loaded = load_model(str(path))
    llms = {}
    for name in PATHS:
        with _path(name):
            llms[name] = LLM.from_engine(LLMEngine(config=EngineConfig(num_kv_blocks=64),
                                                   loaded=loaded))
    params = SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True)
    speeds, replies = chat_rounds(llms, params, rounds)
    print("\n| path | tok/s (best) | median |")
    print("|---|---|---|")
    for name in PATHS:
        s = sorted(speeds[name])
        print(f"| {name} | {s[-1]:.1f} | {s[len(s) // 2]:.1f} |")
    print(f"\ngreedy replies identical: {replies['in place'] == replies['widened']}")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("what", choices=["kernels", "engine"])
    parser.add_argument("files", nargs="+", type=Path)
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--max-tokens", type=int, default=64)
    args = parser.parse_args(argv)
    if args.what == "kernels":
        bench_kernels(args.files, args.rounds, args.threads)
    else:
        for path in args.files:
            bench_engine(path, args.rounds, args.max_tokens)


if __name__ == "__main__":
    main()
