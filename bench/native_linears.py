"""The default model's int4 linears through our q4_gemv against PyTorch's int4 kernel, one run.

Not a test: `python bench/native_linears.py` on a quiet machine, then copy the table into
docs/KERNELS.md. One loaded model, two engines built over it: one with our kernels, one with
PAGODA_NATIVE_KERNELS=0 (PyTorch's `_weight_int4pack_mm_for_cpu` everywhere), in interleaved
rounds so the machine's drift falls on both. Per engine: the policy its calibration chose, the
bytes its layers hold, one stream's decode tok/s (greedy, `ignore_eos`, 1 / median time per
output token; best of --rounds), --concurrency streams' aggregate tok/s, and teacher-forced
quality against the dequantized model over tests/engine/data/quality_text.txt.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from throughput import describe_machine, make_workload, run_engine
from weight_bytes import tensor_bytes

from pagoda.engine import EngineConfig, LLMEngine
from pagoda.engine.loading.loader import load_model
from pagoda.engine.worker.evaluation import compare, prompt_logits
from pagoda.engine.worker.model_runner import ModelRunner

QUALITY_TEXT = Path(__file__).parent.parent / "tests" / "engine" / "data" / "quality_text.txt"
PATHS = {"q4_gemv": "1", "int4pack": "0"}  # PAGODA_NATIVE_KERNELS for each


def build(loaded, config: EngineConfig, native: str) -> LLMEngine:
    os.environ["PAGODA_NATIVE_KERNELS"] = native
    try:
        return LLMEngine(config=config, loaded=loaded)
    finally:
        del os.environ["PAGODA_NATIVE_KERNELS"]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--concurrency", type=int, default=4, help="0 skips the batch run")
    parser.add_argument("--no-quality", action="store_true")
    args = parser.parse_args(argv)
    print(f"Machine: {describe_machine()}\n")
    loaded = load_model()
    config = EngineConfig(num_kv_blocks=512)
    engines = {name: build(loaded, config, native) for name, native in PATHS.items()}
    for name, engine in engines.items():
        print(f"{name}: {engine.runner.model.layers[0].qkv_proj.method.policy.reason}\n")

    one = make_workload(loaded.tokenizer, 1, 7)
    one[0].max_tokens = args.max_tokens
    batch = make_workload(loaded.tokenizer, args.concurrency, 0) if args.concurrency else []
    rounds: dict[str, list[float]] = {name: [] for name in engines}
    aggregate: dict[str, list[float]] = {name: [] for name in engines}
    for i in range(args.rounds):
        for name, engine in engines.items():
            rounds[name].append(1 / run_engine(engine, one, name).tpot_p50)
            if batch:
                aggregate[name].append(run_engine(engine, batch, name).tok_per_s)
        print(f"round {i + 1}: " + ", ".join(f"{name} {rounds[name][-1]:.1f} tok/s"
                                             for name in engines), flush=True)
    for name in engines:
        print(f"{name} one stream decode tok/s per round: "
              + ", ".join(f"{r:.1f}" for r in rounds[name]))

    quality = {}
    if not args.no_quality:
        token_ids = loaded.tokenizer.encode(QUALITY_TEXT.read_text(encoding="utf-8"))
        eval_config = EngineConfig(num_kv_blocks=256)
        reference = prompt_logits(ModelRunner(load_model(quantization="none"), eval_config),
                                  token_ids)
        for name, engine in engines.items():
            quality[name] = compare(reference, prompt_logits(engine.runner, token_ids), token_ids)

    print("\n| linears | layers + vocabulary MB | one stream decode tok/s (best) | median | "
          f"{args.concurrency} streams tok/s (best) | top-1 agreement | perplexity ratio |")
    print("|---|---|---|---|---|---|---|")
    for name, engine in engines.items():
        model = engine.runner.model
        weights = tensor_bytes([model.lm_head, model.layers]) / 1e6
        runs = sorted(rounds[name])
        conc = f"{max(aggregate[name]):.1f}" if batch else "-"
        q = quality.get(name)
        cells = f"{q.top1_agreement:.2%} | {q.perplexity_ratio:.4f}" if q else "- | -"
        print(f"| {name} | {weights:.0f} | {runs[-1]:.1f} | {runs[len(runs) // 2]:.1f} | "
              f"{conc} | {cells} |")


if __name__ == "__main__":
    main()
