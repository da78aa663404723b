"""The engine's resident memory: after importing it, after loading a model, after one greedy chat
of 128 tokens, and after 32 such chats at once, with the KV pool's size beside (its pages are
committed as blocks are first written, so "loaded" holds none of it yet).

Each figure is the process's VmRSS (`pagoda.engine.worker.process_memory.resident_bytes`), what `top` and LM Studio
show; compare it with llama.cpp's server measured the same way, in the same window. Not a test:
results go to docs/BENCHMARKS.md.

    .venv/bin/python bench/memory.py [--model PATH] [--kv-cache-dtype float16] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from cpu_info import cpu_name

from pagoda.engine.worker.process_memory import resident_bytes

CHAT = [{"role": "user", "content": "Tell me about the history of the printing press."}]
REPLY_TOKENS = 128
CONCURRENT = 32


def measure(model: str | None, engine_options: dict) -> dict:
    from pagoda.engine import LLM, SamplingParams

    figures = {"engine imported": resident_bytes()}
    llm = LLM(model, **engine_options)
    figures["loaded"] = resident_bytes()
    params = SamplingParams(temperature=0, max_tokens=REPLY_TOKENS, ignore_eos=True)
    llm.chat(CHAT, params)
    figures["after one 128-token chat"] = resident_bytes()
    llm.chat([CHAT] * CONCURRENT, params)
    figures[f"after {CONCURRENT} chats at once"] = resident_bytes()
    runner = llm.engine.runner
    return {"cpu": cpu_name(), "model": model or "default (SmolLM2-135M-Instruct Q4_1)",
            "kv_cache_dtype": str(runner.kv_dtype).removeprefix("torch."),
            "kv_pool_bytes": runner.num_blocks * runner.bytes_per_block(),
            "kv_pool_tokens": runner.num_blocks * runner.block_size,
            "preemptions": llm.engine.stats().num_preemptions,
            # Whether layers keep a copy to dequantize from (chosen by timing at load).
            "cpu_linear_path": _cpu_linear_path(runner),
            "resident_bytes": figures}


def _cpu_linear_path(runner) -> str:
    """The first quantized layer's policy (a stacked QKV's parts share it)."""
    for linear in runner.model.linears():
        method = linear.method
        for part in getattr(method, "methods", [method]):
            policy = getattr(part, "policy", None)
            if policy is not None:
                return policy.reason
    return "not a CPU quantized layer"


def print_table(result: dict) -> None:
    print(f"CPU: {result['cpu']}; model: {result['model']}")
    print(f"KV pool: {result['kv_pool_tokens']} tokens, {result['kv_cache_dtype']}, "
          f"{result['kv_pool_bytes'] / 2**20:.0f} MiB at most; "
          f"preemptions: {result['preemptions']}")
    print(f"CPU linear path: {result['cpu_linear_path']}")
    for stage, value in result["resident_bytes"].items():
        print(f"  {stage:<28} {value / 1e9:6.3f} GB")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", help="a .gguf file or model folder (default: the bundled one)")
    parser.add_argument("--kv-cache-dtype", default="auto")
    parser.add_argument("--threads", type=int, help="torch threads (default: every core)")
    parser.add_argument("--json", type=Path, help="also write the figures here")
    args = parser.parse_args()
    options = {"kv_cache_dtype": args.kv_cache_dtype, "num_threads": args.threads}
    result = measure(args.model, options)
    print_table(result)
    if args.json:
        args.json.write_text(json.dumps(result, indent=2), encoding="utf-8")


if __name__ == "__main__":
    main()
