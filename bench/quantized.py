"""Quantized weights against the dequantized ("none") path, same model, same run.

Not a test: `python bench/quantized.py` on a quiet machine, then copy the tables into
docs/BENCHMARKS.md. Reports, for each quantization mode: load time, the bytes the weights hold
resident (every tensor the model keeps, shared ones once), one stream's decode tok/s (best of
--rounds, modes interleaved), N concurrent streams' aggregate tok/s, and teacher-forced quality
against "none" over tests/engine/data/quality_text.txt.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from throughput import describe_machine, make_workload, run_engine
from weight_bytes import tensor_bytes

from pagoda.engine import EngineConfig, LLMEngine
from pagoda.engine.loading.loader import LoadedModel, load_model
from pagoda.engine.worker.evaluation import compare, prompt_logits
from pagoda.engine.worker.model_runner import ModelRunner

QUALITY_TEXT = Path(__file__).parent.parent / "tests" / "engine" / "data" / "quality_text.txt"


def _resident(model) -> int:
    return tensor_bytes([model.embed_tokens, model.lm_head, model.norm, model.layers])


def timed_load(quantization: str) -> tuple[LoadedModel, float]:
    start = time.perf_counter()
    loaded = load_model(quantization=quantization)
    return loaded, time.perf_counter() - start


def one_stream(engine: LLMEngine, tokenizer, max_tokens: int) -> float:
    request = make_workload(tokenizer, 1, 7)[0]
    request.max_tokens = max_tokens
    return run_engine(engine, [request], "one").tok_per_s


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--modes", nargs="+", default=["none", "auto", "int8"])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--concurrency", type=int, default=32, help="0 skips the batch run")
    args = parser.parse_args(argv)
    config = EngineConfig(num_kv_blocks=1024)
    print(f"Machine: {describe_machine()}\n")

    loaded, engines, load_s = {}, {}, {}
    for mode in args.modes:
        loaded[mode], load_s[mode] = timed_load(mode)
        start = time.perf_counter()
        engines[mode] = LLMEngine(config=config, loaded=loaded[mode])
        load_s[mode] += time.perf_counter() - start
    tokenizer = loaded[args.modes[0]].tokenizer

    best = dict.fromkeys(args.modes, 0.0)
    for _ in range(args.rounds):
        for mode in args.modes:
            best[mode] = max(best[mode], one_stream(engines[mode], tokenizer, args.max_tokens))
    batch = {}
    if args.concurrency:
        requests = make_workload(tokenizer, args.concurrency, 0)
        for mode in args.modes:
            batch[mode] = run_engine(engines[mode], requests, mode).tok_per_s

    token_ids = tokenizer.encode(QUALITY_TEXT.read_text(encoding="utf-8"))
    eval_config = EngineConfig(num_kv_blocks=256)
    reference = prompt_logits(ModelRunner(loaded["none"], eval_config), token_ids)

    base = args.modes[0]
    weight_bytes = {m: _resident(engines[m].runner.model) for m in args.modes}
    print("| quantization | load + engine s | weights resident MB | vs none | one stream tok/s "
          f"| vs none | {args.concurrency} concurrent tok/s | vs none | top-1 agreement "
          "| perplexity ratio |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for mode in args.modes:
        report = compare(reference, prompt_logits(ModelRunner(loaded[mode], eval_config),
                                                  token_ids), token_ids)
        conc = f"{batch[mode]:.1f} | {batch[mode] / batch[base]:.2f}x" if batch else "- | -"
        print(f"| {mode} | {load_s[mode]:.1f} | {weight_bytes[mode] / 1e6:.0f} | "
              f"{weight_bytes[mode] / weight_bytes[base]:.2f}x | {best[mode]:.1f} | "
              f"{best[mode] / best[base]:.2f}x | {conc} | {report.top1_agreement:.1%} | "
              f"{report.perplexity_ratio:.4f} |")
    print(f"\n{report.num_tokens} tokens teacher-forced; one stream: {args.max_tokens} greedy "
          f"tokens, best of {args.rounds} rounds.")


if __name__ == "__main__":
    main()
