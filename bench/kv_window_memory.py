"""KV cache bytes a Gemma-3-shaped chat holds at 32k tokens of context, its sliding-window layers
in KV cache groups of their own, against the same model with every layer global.

The model is Gemma 3's KV layout at its real widths (one KV head of 256 dims, bf16, as the 1B;
pass --kv-heads 4 for the 4B's), with fewer layers: five windowed layers and one global, its
pattern. The engine's own scheduler and KV cache manager run a 32k-token prompt in prefill chunks
and then a reply, over pools sized by the engine's rule (pagoda.engine.models.kv_cache_sizing); after
every step the bytes the sequence holds are read from the manager's stats. No forward pass runs:
which blocks are held depends on the bookkeeping alone, and the bytes per block are the
runner's (2 x layers x block_size x kv_heads x head_dim x 2 bytes). Not a test: results go to
docs/BENCHMARKS.md.

    .venv/bin/python bench/kv_window_memory.py [--window 512] [--context 32768] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from cpu_info import cpu_name

from pagoda.engine.config import EngineConfig, SchedulerConfig
from pagoda.engine.core.kv_cache_manager import KVCacheGroup, KVCacheManager
from pagoda.engine.core.scheduler import Scheduler
from pagoda.engine.core.sequence import Sequence
from pagoda.engine.models.kv_cache_sizing import group_num_blocks
from pagoda.engine.sampling.params import SamplingParams

WINDOWED_LAYERS, GLOBAL_LAYERS = 5, 1
HEAD_DIM, BF16 = 256, 2
REPLY_TOKENS = 256


def bytes_per_block(layers: int, kv_heads: int, block_size: int) -> int:
    return 2 * layers * block_size * kv_heads * HEAD_DIM * BF16


def groups(windows: list[int], layers: list[int], kv_heads: int,
           config: EngineConfig) -> tuple[KVCacheGroup, ...]:
    """The pools the runner makes for these groups (window 0 first: every block kept)."""
    sizes = [bytes_per_block(n, kv_heads, config.block_size) for n in layers]
    counts = group_num_blocks(config, sizes, windows, config.max_model_len, None)
    return tuple(KVCacheGroup(n, w, b) for n, w, b in zip(counts, windows, sizes, strict=True))


def peak_held_bytes(kv_groups: tuple[KVCacheGroup, ...], config: EngineConfig,
                    context: int) -> tuple[int, int, int]:
    """A chat of `context` prompt tokens and a reply, stepped by the engine's scheduler: the
    most bytes it held, what it held at its last step, and the pools' bytes."""
    kv = KVCacheManager(kv_groups, config.block_size)
    scheduler = Scheduler(SchedulerConfig(config.max_num_seqs, config.max_num_batched_tokens,
                                          config.max_model_len, None), kv)
    prompt = [(7 * i) % 50_000 for i in range(context - REPLY_TOKENS)]
    scheduler.add(Sequence("chat", prompt, SamplingParams(max_tokens=REPLY_TOKENS,
                                                          ignore_eos=True), frozenset()))
    peak = last = 0
    while scheduler.running or scheduler.waiting:
        out = scheduler.schedule()
        last = kv.stats().held_bytes
        peak = max(peak, last)
        scheduler.update_from_output(out, [[1] if item.samples else [] for item in out.scheduled])
    return peak, last, kv.stats().total_bytes


def measure(window: int, context: int, kv_heads: int) -> dict:
    config = EngineConfig(max_model_len=context, dtype=None)
    hybrid = groups([0, window], [GLOBAL_LAYERS, WINDOWED_LAYERS], kv_heads, config)
    every_global = groups([0], [GLOBAL_LAYERS + WINDOWED_LAYERS], kv_heads, config)
    h_peak, h_last, h_pool = peak_held_bytes(hybrid, config, context)
    g_peak, g_last, g_pool = peak_held_bytes(every_global, config, context)
    return {"cpu": cpu_name(), "window": window, "context": context, "kv_heads": kv_heads,
            "layers": f"{WINDOWED_LAYERS} windowed + {GLOBAL_LAYERS} global",
            "chunk": config.max_num_batched_tokens, "block_size": config.block_size,
            "held_peak_bytes": h_peak, "held_last_bytes": h_last, "pool_bytes": h_pool,
            "global_held_peak_bytes": g_peak, "global_held_last_bytes": g_last,
            "global_pool_bytes": g_pool, "ratio_peak": h_peak / g_peak,
            "ratio_pool": h_pool / g_pool}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--window", type=int, nargs="+", default=[512, 1024])
    parser.add_argument("--context", type=int, default=32768)
    parser.add_argument("--kv-heads", type=int, default=1)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    results = [measure(w, args.context, args.kv_heads) for w in args.window]
    for r in results:
        print(f"window {r['window']}, {r['context']} tokens ({r['layers']}, {r['kv_heads']} KV "
              f"head(s) x {HEAD_DIM}, bf16): held {r['held_peak_bytes'] / 2**20:.1f} MiB at "
              f"most vs {r['global_held_peak_bytes'] / 2**20:.1f} MiB all global = "
              f"{r['ratio_peak']:.3f}x; pools {r['pool_bytes'] / 2**20:.1f} vs "
              f"{r['global_pool_bytes'] / 2**20:.1f} MiB = {r['ratio_pool']:.3f}x")
    print(results[0]["cpu"])
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
