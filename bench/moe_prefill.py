"""A mixture-of-experts file's prefill (1,000 tokens, as bench/moe_vs_llama_cpp.py's `Ours`
times it: `LLM.generate` of one prompt of ids, one token out) with the CPU experts' two
kernels: as the load-time calibration chose them (moe_tiles for calls of many rows an
expert), moe_forward alone, and moe_tiles alone wherever it reads the layer. The three run
interleaved in one process, each round a new prompt (the prefix cache would answer a repeat).

Not a test: run it on a quiet machine, then copy the table into docs/KERNELS.md.

    .venv/bin/python bench/moe_prefill.py FILE.gguf [--rounds 3] [--tokens 1000]
"""

from __future__ import annotations

import argparse
import logging
import statistics
import time

from cpu_info import cpu_name
from moe_vs_llama_cpp import Ours, text

from pagoda.engine.quantization.cpu_experts import CpuExpertsMethod

CHOICES = {
    "calibrated": CpuExpertsMethod.runs_tiles,
    "moe_forward alone": lambda self, m, top_k: False,
    "moe_tiles alone": lambda self, m, top_k: self._many is not None,
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--tokens", type=int, default=1000)
    args = parser.parse_args()
    logging.basicConfig(format="%(name)s: %(message)s")
    logging.getLogger("pagoda.engine.quantization.cpu_experts").setLevel(logging.INFO)  # the choice
    ours = Ours(args.model)
    engine = ours.llm.engine
    tokenizer = engine.tokenizer if hasattr(engine, "tokenizer") else ours.llm.tokenizer
    rates: dict[str, list[float]] = {name: [] for name in CHOICES}
    for r in range(args.rounds):
        for i, (name, choice) in enumerate(CHOICES.items()):
            CpuExpertsMethod.runs_tiles = choice
            ids = tokenizer.encode(text(200 + r * len(CHOICES) + i, args.tokens))[:args.tokens]
            start = time.perf_counter()
            rate = ours.prefill(ids)
            rates[name].append(rate)
            print(f"round {r + 1}, {name}: {rate:.1f} tok/s "
                  f"({time.perf_counter() - start:.1f} s)", flush=True)
    CpuExpertsMethod.runs_tiles = CHOICES["calibrated"]
    print(f"{cpu_name()}, 2 threads; {args.model}; prefill of {args.tokens} tokens")
    print("| experts' kernel | tok/s, best | median |")
    print("|---|---|---|")
    for name, values in rates.items():
        print(f"| {name} | {max(values):.1f} | {statistics.median(values):.1f} |")


if __name__ == "__main__":
    main()
