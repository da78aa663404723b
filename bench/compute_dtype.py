"""The default model computing in bf16 against fp32, every weight dequantized, in one run.

Not a test: `python bench/compute_dtype.py` on a quiet machine, then copy the table into
docs/BENCHMARKS.md (tests/engine/test_compute_dtype.py asserts the targets). The model loads
once with quantization "none", so only EngineConfig.dtype differs (weights, activations, norms,
attention, KV cache). Per dtype: the teacher-forced pass over tests/engine/data/quality_text.txt
(its tok/s, top-1 agreement with fp32, perplexity), and the greedy replies to the parity tests'
8 prompts in one batch (output tok/s with their prefill, how many are fp32's token for token,
and where the others part).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import torch
from cpu_info import cpu_name

ROOT = Path(__file__).resolve().parents[1]
# The tests' helpers: `tests.` from the root, and test_parity's own `from tiny_models import`.
sys.path[:0] = [str(ROOT), str(ROOT / "tests" / "engine")]

from pagoda.engine import LLM, EngineConfig, LLMEngine
from pagoda.engine.loading.loader import load_model
from pagoda.engine.worker.evaluation import compare, prompt_logits
from tests.engine.models.test_parity import MAX_NEW_TOKENS, parity_prompts
from tests.engine.test_compute_dtype import (
    first_difference,
    gaps_where_predictions_part,
    greedy_outputs,
    runner_in,
)

QUALITY_TEXT = ROOT / "tests" / "engine" / "data" / "quality_text.txt"
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--threads", type=int, default=len(os.sched_getaffinity(0)))
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    print(f"Machine: {cpu_name()}, {args.threads} threads, torch {torch.__version__}\n")
    loaded = load_model(quantization="none")
    token_ids = loaded.tokenizer.encode(QUALITY_TEXT.read_text(encoding="utf-8"))
    prompts = parity_prompts(loaded.tokenizer)

    logits, forced_s, replies, greedy_s = {}, {}, {}, {}
    for name, dtype in DTYPES.items():
        runner = runner_in(loaded, dtype)
        start = time.perf_counter()
        logits[name] = prompt_logits(runner, token_ids)
        forced_s[name] = time.perf_counter() - start
        del runner
        config = EngineConfig(num_kv_blocks=128, num_threads=args.threads, dtype=dtype)
        llm = LLM.from_engine(LLMEngine(config=config, loaded=loaded))
        start = time.perf_counter()
        replies[name] = greedy_outputs(llm, prompts, logprobs=2)
        greedy_s[name] = time.perf_counter() - start
        del llm

    print("| compute dtype | teacher-forced tok/s | top-1 agreement with fp32 | perplexity "
          "| vs fp32 | greedy, 8 prompts: output tok/s | replies identical to fp32's |")
    print("|---|---|---|---|---|---|---|")
    for name in DTYPES:
        report = compare(logits["fp32"], logits[name], token_ids)
        same = sum(first_difference(r.token_ids, w.token_ids) is None
                   for r, w in zip(replies[name], replies["fp32"], strict=True))
        output_tokens = sum(len(r.token_ids) for r in replies[name])
        print(f"| {name} | {len(token_ids) / forced_s[name]:.0f} | {report.top1_agreement:.2%} "
              f"| {report.perplexity:.3f} | {report.perplexity_ratio:.4f} "
              f"| {output_tokens / greedy_s[name]:.1f} | {same}/{len(prompts)} |")
    gaps = gaps_where_predictions_part(logits["fp32"][:-1], logits["bf16"][:-1])
    print(f"\n{len(token_ids) - 1} tokens teacher-forced (chunks of 256): bf16 predicted another "
          f"token than fp32 at {len(gaps)}, where fp32's top-2 logit gap was at most "
          f"{gaps.max().item() if len(gaps) else 0:.3f}. Greedy: up to {MAX_NEW_TOKENS} tokens a "
          "reply, prefill included.")
    for i, (got, want) in enumerate(zip(replies["bf16"], replies["fp32"], strict=True)):
        pos = first_difference(got.token_ids, want.token_ids)
        if pos is not None:
            top = want.logprobs[pos].top
            gap = top[0].logprob - top[1].logprob
            print(f"prompt {i}: bf16 parts from fp32 at reply token {pos} of "
                  f"{len(want.token_ids)} (fp32's top-2 logit gap there {gap:.3f})")


if __name__ == "__main__":
    main()
