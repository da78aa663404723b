"""The prefix cache's disk tier (issue 16): reopening a long chat in a fresh process, with and
without the blocks kept on disk, and what keeping them costs while generating.

For each history length: one process reads the history and answers (saving its blocks to a
fresh folder), then fresh processes send one more message after that history, with the disk
tier and without it, and report the time to first token (with the disk tier's own measure of
reading a block, what its cost model weighs). Then the cost: one stream decodes the
same tokens with the tier on and off, alternately, and the mean step time of each is compared.
Not a test: run on a quiet machine, copy the table into docs/BENCHMARKS.md.

    .venv/bin/python bench/disk_prefix_cache.py [--histories 500 2000 6000] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from cpu_info import cpu_name

ROOT = Path(__file__).resolve().parents[1]
NEW_MESSAGE_TOKENS = 30
CHILD_TIMEOUT_S = 900
SENTENCE = ("the keeper climbed the lighthouse stairs each evening to light the lamp and wrote "
            "down the ships she saw passing in the dark water below")


def history_tokens(tokenizer, n: int, seed: int) -> list[int]:
    """n tokens of plausible chat text (the same for the same seed)."""
    words = SENTENCE.split()
    text, i = [], seed
    while len(text) < n:
        text.append(words[i % len(words)])
        i = i * 1103515245 + 12345 & 0x7FFFFFFF
    return tokenizer.encode(" ".join(text))[:n]


def child(args: argparse.Namespace) -> dict:
    """One fresh engine: read `history` (+ a new message), answer `max_tokens`, report."""
    from pagoda.engine.config import EngineConfig
    from pagoda.engine.llm_engine import LLMEngine
    from pagoda.engine.sampling.params import SamplingParams

    config = EngineConfig(disk_cache_dir=args.disk, max_model_len=8192)
    engine = LLMEngine(None, config)
    prompt = history_tokens(engine.tokenizer, args.history, seed=1)
    if args.new_message:
        prompt += history_tokens(engine.tokenizer, NEW_MESSAGE_TOKENS, seed=args.history)
    params = SamplingParams(temperature=0, max_tokens=args.max_tokens, ignore_eos=True)
    began = time.monotonic()
    engine.add_request("r", prompt, params)
    step_times, final = [], None
    while engine.has_unfinished_requests():
        step_began = time.perf_counter()
        for out in engine.step():
            final = out if out.finished else final
        step_times.append(time.perf_counter() - step_began)
    ttft = final.metrics.first_token_time - began
    engine.close(timeout=300)
    stats = engine.stats().disk_cache
    decode = step_times[-(args.max_tokens - 1):] if args.max_tokens > 1 else []
    read_s = engine.disk_cache.read_s_per_block if engine.disk_cache else None
    return {"prompt_tokens": len(prompt), "ttft_s": ttft, "cached_tokens": final.num_cached_tokens,
            "decode_step_ms": 1000 * sum(decode) / len(decode) if decode else None,
            "disk_bytes": stats.size_bytes if stats else 0,
            "disk_blocks": stats.num_blocks if stats else 0,
            "read_ms_per_block": None if read_s is None else 1000 * read_s}


def run_child(**kwargs) -> dict:
    argv = [sys.executable, __file__, "--child"]
    for name, value in kwargs.items():
        if value is not None and value is not False:
            argv += [f"--{name.replace('_', '-')}"] + ([] if value is True else [str(value)])
    done = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True,
                          timeout=CHILD_TIMEOUT_S, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def reopen(history: int) -> dict:
    with tempfile.TemporaryDirectory() as folder:
        first = run_child(history=history, max_tokens=1, disk=folder)
        with_disk = run_child(history=history, max_tokens=1, disk=folder, new_message=True)
        without = run_child(history=history, max_tokens=1, new_message=True)
    return {"history": history, "bytes_per_token": first["disk_bytes"] / history,
            "disk_mib": first["disk_bytes"] / 2**20,
            "ttft_with_disk_s": with_disk["ttft_s"], "cached_tokens": with_disk["cached_tokens"],
            "read_ms_per_block": with_disk["read_ms_per_block"],
            "ttft_without_s": without["ttft_s"],
            "ratio": with_disk["ttft_s"] / without["ttft_s"]}


def write_cost(rounds: int, max_tokens: int) -> dict:
    """Mean decode step with the tier on and off, alternately, from a short prompt: every 16
    tokens a block fills and is saved."""
    on, off = [], []
    for _ in range(rounds):
        with tempfile.TemporaryDirectory() as folder:
            on.append(run_child(history=64, max_tokens=max_tokens, disk=folder)["decode_step_ms"])
        off.append(run_child(history=64, max_tokens=max_tokens)["decode_step_ms"])
    mean_on, mean_off = sum(on) / len(on), sum(off) / len(off)
    return {"step_ms_on": on, "step_ms_off": off, "mean_on": mean_on, "mean_off": mean_off,
            "growth": mean_on / mean_off - 1}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--histories", type=int, nargs="+", default=[500, 2000, 6000])
    parser.add_argument("--rounds", type=int, default=6, help="write-cost rounds, on and off")
    parser.add_argument("--decode-tokens", type=int, default=512)
    parser.add_argument("--json", type=Path)
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--history", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--max-tokens", type=int, default=1, help=argparse.SUPPRESS)
    parser.add_argument("--disk", help=argparse.SUPPRESS)
    parser.add_argument("--new-message", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(args)))
        return 0
    print(f"{cpu_name()}, {os.cpu_count()} cores; default model; warm page cache\n")
    print("| history | on disk | bytes/token | TTFT, blocks on disk | read, per block "
          "| TTFT, recomputed | ratio |")
    print("|---:|---:|---:|---:|---:|---:|---:|")
    rows = []
    for history in args.histories:
        row = reopen(history)
        rows.append(row)
        read = row["read_ms_per_block"]
        print(f"| {history:,} | {row['disk_mib']:.0f} MiB | {row['bytes_per_token']:,.0f} | "
              f"{row['ttft_with_disk_s']:.2f} s ({row['cached_tokens']:,} cached) | "
              f"{'-' if read is None else f'{read:.2f} ms'} | "
              f"{row['ttft_without_s']:.2f} s | {row['ratio']:.2f}x |", flush=True)
    cost = write_cost(args.rounds, args.decode_tokens)
    print(f"\ndecode step, one stream, {args.decode_tokens} tokens: tier on "
          f"{cost['mean_on']:.2f} ms, off {cost['mean_off']:.2f} ms "
          f"({100 * cost['growth']:+.1f}%); rounds on {cost['step_ms_on']}, "
          f"off {cost['step_ms_off']}")
    if args.json:
        args.json.write_text(json.dumps({"cpu": cpu_name(), "reopen": rows, "write_cost": cost},
                                        indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
