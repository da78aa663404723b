"""pagoda/kernels/cpu/q8_gemv.c (grouped int8 weights read in place) against today's path for them, the
weight split into two int4 halves through q4_gemv, in one run.

Not a test: run it on a quiet machine, then copy the tables into docs/KERNELS.md.

    .venv/bin/python bench/q8_gemv.py kernels   # one row, the vocabulary and 1B shapes
    .venv/bin/python bench/q8_gemv.py engine    # the default model: decode tok/s, replies
    .venv/bin/python bench/q8_gemv.py memory    # the default model's resident set
    .venv/bin/python bench/q8_gemv.py rows --base REV   # decode-time shapes, this tree vs REV

`kernels`: µs per call (best and median of interleaved rounds) and the weight bytes each call
reads turned into GB/s, each kernel cycling through copies of the weight larger together than
the CPU's caches (a decode step reads the vocabulary after 30 layers: from memory).
`engine`: two engines over one loaded default model, one with q8_gemv and one with it switched
off (the halves, as before), in interleaved rounds of one `LLM.chat` of 128 greedy tokens with
`ignore_eos`; their replies must be the same tokens. `memory`: each path's resident set after
loading the model and one chat, in fresh processes, alternated.
`rows`: the large matrices of a mixture-of-experts decode step (gpt-oss-20b's Q8_0 attention
and vocabulary, Qwen3-30B-A3B's Q6_K vocabulary) at 1-3 activation rows, through the entry
point the engine calls for each (`q8_linear16` for layers, `q8_linear` for the vocabulary),
this tree's build against git revision REV's in the same process, in interleaved rounds, a
round of one build calling each of the copies of the weight (together larger than the caches)
in turn.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import torch
from cpu_info import cpu_name
from kernel_ab import build_revision, build_tree

from pagoda.engine.quantization.tensors import Int8Weight, quantize_int8, split_int8_into_int4
from pagoda.kernels.cpu.q4_gemv import Q4Gemv
from pagoda.kernels.cpu.q8_gemv import Q8Gemv

# (name, outputs, inputs, activations): the vocabularies run the int8 pass, the 1B's Q6_K
# ffn_down the int16 one.
SHAPES = (("135M vocabulary", 49152, 576, "int8"), ("1B vocabulary", 32000, 2048, "int8"),
          ("vocabulary", 49152, 2048, "int8"), ("1B ffn_down (Q6_K)", 2048, 8192, "int16"))
CYCLE_BYTES = 200 << 20
# (name, outputs, inputs, block type, int16 activations): a decode step's largest matrices.
DECODE_SHAPES = (("gpt-oss-20b q", 4096, 2880, "Q8_0", True),
                 ("gpt-oss-20b o", 2880, 4096, "Q8_0", True),
                 ("gpt-oss-20b k or v", 512, 2880, "Q8_0", True),
                 ("gpt-oss-20b vocabulary", 49152, 2880, "Q8_0", False),
                 ("Qwen3-30B-A3B vocabulary", 49152, 2048, "Q6_K", False))
Q6_K_D_AT = 208  # the fp16 d's byte offset in a 210-byte Q6_K super-block
CHAT = [{"role": "user", "content": "Tell me about the history of the printing press."}]
PATHS = ("q8_gemv", "halves")


def _kernel_calls(q8: Q8Gemv, q4: Q4Gemv, n: int, k: int, wide: bool,
                  threads: int) -> dict[str, tuple[int, Callable[[int, torch.Tensor], object]]]:
    """Per path: bytes one call reads, and call(copy index, x)."""
    copies = max(2, CYCLE_BYTES // (n * k))
    torch.manual_seed(0)
    weights = [quantize_int8(torch.randn(n, k), group_size=32) for _ in range(copies)]
    # As GGUF's Q8_0 holds them: fp16 scales (exact).
    weights = [Int8Weight(w.q, w.scales.half(), 32) for w in weights]
    operands = [Q8Gemv.operand(w.q, w.scales) for w in weights]
    halves = [split_int8_into_int4(w) for w in weights]
    repacked = [q4.repack(h.packed, h.scales, h.mins) for h in halves]
    del halves
    q4_call = q4.linear16 if wide else q4.linear
    return {
        "q8_gemv": (weights[0].nbytes,
                    lambda i, x: q8.linear(operands[i % copies], x, threads=threads, wide=wide)),
        "halves (q4_gemv)": (repacked[0].data.nbytes,
                             lambda i, x: q4_call(repacked[i % copies], x, threads=threads)),
    }


def bench_kernels(rounds: int, threads: int) -> None:
    build = Path(tempfile.mkdtemp(prefix="q8-bench-"))
    q8, q4 = Q8Gemv.load(build), Q4Gemv.load(build)
    print(f"CPU: {cpu_name()}, {threads} threads, one row\n")
    print("| weight | activations | path | MB read | µs (best) | µs (median) | GB/s (best) |")
    print("|---|---|---|---|---|---|---|")
    for name, n, k, act in SHAPES:
        calls = _kernel_calls(q8, q4, n, k, act == "int16", threads)
        x = torch.randn(1, k)
        times: dict[str, list[float]] = {path: [] for path in calls}
        for i in range(rounds):
            for path, (_, call) in calls.items():
                start = time.perf_counter()
                call(i, x)
                times[path].append(time.perf_counter() - start)
        for path, (nbytes, _) in calls.items():
            t = sorted(times[path][1:])
            print(f"| {name} {n}x{k} | {act} | {path} | {nbytes / 1e6:.1f} | {t[0] * 1e6:.0f} | "
                  f"{t[len(t) // 2] * 1e6:.0f} | {nbytes / t[0] / 1e9:.1f} |", flush=True)


def _decode_operands(n: int, k: int, kind: str) -> list:
    """Copies of a random weight of that type, together past CYCLE_BYTES: int8 with fp16
    scales (Q8_0), or Q6_K blocks whose d is 0.01 (random bytes elsewhere)."""
    rng = np.random.default_rng(0)
    per = n * k * (34 / 32 if kind == "Q8_0" else 210 / 256)
    operands = []
    for _ in range(max(2, int(CYCLE_BYTES // per) + 1)):
        if kind == "Q8_0":
            q = torch.from_numpy(rng.integers(-127, 128, (n, k), dtype=np.int8))
            scales = torch.from_numpy(rng.uniform(1e-3, 1e-2, (n, k // 32))).half()
            operands.append(Q8Gemv.operand(q, scales))
            continue
        blocks = rng.integers(0, 256, (n, k // 256, 210), dtype=np.uint8)
        blocks[:, :, Q6_K_D_AT:] = np.frombuffer(np.float16(0.01).tobytes(), np.uint8)
        operands.append(Q8Gemv.q6_k_operand(torch.from_numpy(blocks.reshape(n, -1))))
    return operands


def _decode_call(lib: ctypes.CDLL, operand, m: int, wide: bool, threads: int):
    """call(x): the engine's entry point on the operand, its buffers kept between calls."""
    fn = lib.q8_linear16 if wide else lib.q8_linear
    fn.restype = ctypes.c_int
    n, k = operand.out_features, operand.in_features
    y, work = torch.empty(m, n), torch.empty(m * k * 2 + m * k // 4, dtype=torch.uint8)
    q, scales, mins, halves = operand.pointers
    head = (-1, ctypes.c_void_p(q), ctypes.c_void_p(scales), ctypes.c_void_p(mins), halves, n, k)

    def call(x: torch.Tensor, keep=(y, work)) -> torch.Tensor:
        if fn(*head, ctypes.c_void_p(x.data_ptr()), m, ctypes.c_void_p(y.data_ptr()),
              ctypes.c_void_p(work.data_ptr()), threads):
            raise RuntimeError(f"q8_gemv refused [{n} x {k}] at {m} rows")
        return y
    return call


def bench_rows(base: str, rounds: int, threads: int) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        builds = {"tree": build_tree(Path(tmp))["q8_gemv"],
                  base: build_revision(base, Path(tmp))["q8_gemv"]}
        print(f"CPU: {cpu_name()}, {threads} threads; this tree against {base}, {rounds} "
              f"interleaved rounds, each through every copy of the weight\n")
        print("| weight | type | rows | build | µs (best) | µs (median) | GB/s (best) | bits |")
        print("|---|---|---|---|---|---|---|---|")
        for name, n, k, kind, wide in DECODE_SHAPES:
            operands = _decode_operands(n, k, kind)
            nbytes = n * k * (34 / 32 if kind == "Q8_0" else 210 / 256)
            for m in (1, 2, 3):
                x = torch.randn(m, k)
                calls = {build: [_decode_call(lib, w, m, wide, threads) for w in operands]
                         for build, lib in builds.items()}
                outputs = {build: step[0](x).clone() for build, step in calls.items()}
                same = torch.equal(*outputs.values())
                times: dict[str, list[float]] = {build: [] for build in calls}
                # A build's round goes through every copy, so no call finds its weight in the
                # caches (the other build reading the same copy just before would leave it there).
                for _ in range(rounds):
                    for build, step in calls.items():
                        for call in step:
                            start = time.perf_counter()
                            call(x)
                            times[build].append(time.perf_counter() - start)
                for build, t in times.items():
                    t = sorted(t)
                    print(f"| {name} {n}x{k} | {kind} {'int16' if wide else 'int8'} | {m} | "
                          f"{build} | {t[0] * 1e6:.0f} | {t[len(t) // 2] * 1e6:.0f} | "
                          f"{nbytes / t[0] / 1e9:.1f} | {'same' if same else 'DIFFER'} |",
                          flush=True)
            del operands


@contextmanager
def _path(name: str):
    """q8_gemv as the engine loads it, or switched off (grouped int8 as int4 halves)."""
    from pagoda.engine.worker import kernel_placement

    load = kernel_placement.load_q8_context
    if name == "halves":
        kernel_placement.load_q8_context = lambda: None
    try:
        yield
    finally:
        kernel_placement.load_q8_context = load


@contextmanager
def _int4_policy_of(llms: dict):
    """The int4 layers' calibrated policy of the first engine built, for the later ones: so
    the engines differ only in how grouped int8 runs (a timing on a busy machine can choose
    another int4 path, whose replies would differ for that reason alone)."""
    from pagoda.engine.worker import kernel_placement

    if not llms:
        yield
        return
    first = next(iter(llms.values())).engine.runner.model.layers[0].qkv_proj.method.policy
    calibrate = kernel_placement.int4_policy
    kernel_placement.int4_policy = lambda weights, q4, max_rows: first
    try:
        yield
    finally:
        kernel_placement.int4_policy = calibrate


def chat_rounds(llms: dict, params, rounds: int) -> tuple[dict[str, list[float]], dict]:
    """Interleaved rounds of one `LLM.chat` per engine: each one's tok/s per round, and its
    last reply's tokens."""
    speeds: dict[str, list[float]] = {name: [] for name in llms}
    replies = {}
    for i in range(rounds):
        for name, llm in llms.items():
            start = time.perf_counter()
            out = llm.chat(CHAT, params).outputs[0]
            speeds[name].append(len(out.token_ids) / (time.perf_counter() - start))
            replies[name] = out.token_ids
        print(f"round {i + 1}: " + ", ".join(f"{n} {s[-1]:.1f} tok/s" for n, s in speeds.items()),
              flush=True)
    return speeds, replies


def bench_engine(rounds: int, max_tokens: int) -> None:
    from weight_bytes import tensor_bytes

    from pagoda.engine import LLM, EngineConfig, LLMEngine, SamplingParams
    from pagoda.engine.loading.loader import load_model

    print(f"CPU: {cpu_name()}\n")
    loaded = load_model()
    llms = {}
    for name in PATHS:
        with _path(name), _int4_policy_of(llms):
            llms[name] = LLM.from_engine(LLMEngine(config=EngineConfig(num_kv_blocks=256),
                                                   loaded=loaded))
    policy = llms[PATHS[0]].engine.runner.model.layers[0].qkv_proj.method.policy
    print(f"int4 layers (both engines): {policy.reason}\n")
    params = SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True)
    speeds, replies = chat_rounds(llms, params, rounds)
    print("\n| path | embedding + vocabulary MB | whole model MB | tok/s (best) | median |")
    print("|---|---|---|---|---|")
    for name, llm in llms.items():
        model = llm.engine.runner.model
        # Tensors counted once however many parts hold them (a tied table is one).
        head = tensor_bytes([model.embed_tokens, model.lm_head]) / 1e6
        total = tensor_bytes([model.embed_tokens, model.lm_head, model.layers]) / 1e6
        s = sorted(speeds[name])
        print(f"| {name} | {head:.0f} | {total:.0f} | {s[-1]:.1f} | {s[len(s) // 2]:.1f} |")
    same = replies["q8_gemv"] == replies["halves"]
    print(f"\ngreedy replies identical: {same}")


def resident_set(name: str) -> dict:
    """In this (fresh) process: the resident bytes after loading and after one chat."""
    from memory import measure

    with _path(name):
        figures = measure(None, {})["resident_bytes"]
    return {key: value for key, value in figures.items() if "32 chats" not in key}


def bench_memory(rounds: int) -> None:
    print(f"CPU: {cpu_name()}\n")
    results: dict[str, list[dict]] = {name: [] for name in PATHS}
    for _ in range(rounds):
        for name in PATHS:
            done = subprocess.run([sys.executable, __file__, "rss-child", name], check=True,
                                  capture_output=True, text=True, env=os.environ.copy())
            results[name].append(json.loads(done.stdout.strip().splitlines()[-1]))
    keys = list(results[PATHS[0]][0])
    print("| path | " + " | ".join(f"{k} MB (min)" for k in keys) + " |")
    print("|---|" + "---|" * len(keys))
    for name, runs in results.items():
        cells = [f"{min(r[k] for r in runs) / 1e6:.0f}" for k in keys]
        print(f"| {name} | " + " | ".join(cells) + " |")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("what", choices=["kernels", "engine", "memory", "rows", "rss-child"])
    parser.add_argument("path", nargs="?", choices=PATHS, help="rss-child only")
    parser.add_argument("--rounds", type=int, default=None)
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--base", default="HEAD", help="rows only: the git revision to compare")
    parser.add_argument("--threads", type=int, default=torch.get_num_threads(),
                        help="kernels and rows only")
    args = parser.parse_args(argv)
    if args.what == "kernels":
        bench_kernels(args.rounds or 40, args.threads)
    elif args.what == "engine":
        bench_engine(args.rounds or 6, args.max_tokens)
    elif args.what == "rows":
        bench_rows(args.base, args.rounds or 10, args.threads)
    elif args.what == "memory":
        bench_memory(args.rounds or 3)
    else:
        print(json.dumps(resident_set(args.path)))


if __name__ == "__main__":
    main()
