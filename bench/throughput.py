"""Throughput and latency of Pagoda's engine against HF transformers, same model, same run.

Not a test: run `make bench` (or `python bench/throughput.py --help`) on a quiet machine and copy
the printed tables into docs/BENCHMARKS.md.

Scenarios:
  concurrent  N chat requests at once (fixed-seed mix of prompt and output lengths): aggregate
              output tok/s, TTFT p50/p99, TPOT p50; then the same requests through HF `generate` in
              static, left-padded batches of 8.
  single      one request alone: ours vs HF batch 1.
  multiturn   a 10-turn conversation: TTFT of each turn, prefix caching on vs off.
"""

from __future__ import annotations

import argparse
import json
import platform
import random
import time
from dataclasses import asdict, dataclass, replace

import torch
from cpu_info import cpu_name

from pagoda.engine import EngineConfig, LLMEngine, SamplingParams
from pagoda.engine.loading.loader import LoadedModel, load_model
from pagoda.engine.text.chat_template import encode_chat

TOPICS = ["the ocean", "a lighthouse keeper", "quantum computers", "bread baking", "the moon",
          "a lost robot", "mountain climbing", "ancient Rome", "honeybees", "a jazz musician",
          "volcanoes", "chess strategy", "rainforests", "a time traveller", "origami", "comets"]
ASKS = ["Write a short story about {}.", "Explain {} to a child.", "Give me five facts about {}.",
        "Write a poem about {}.", "Describe a day spent with {} in detail."]
CONTEXT = ("Here is some background I collected earlier, please take it into account. "
           "It covers history, notable people, common misconceptions and open questions. ")


@dataclass(slots=True)
class Request:
    prompt_token_ids: list[int]
    max_tokens: int


@dataclass(slots=True)
class RunResult:
    label: str
    num_requests: int
    output_tokens: int
    seconds: float
    ttft_p50: float | None = None
    ttft_p99: float | None = None
    tpot_p50: float | None = None

    @property
    def tok_per_s(self) -> float:
        return self.output_tokens / self.seconds


def make_workload(tokenizer, n: int, seed: int) -> list[Request]:
    """A fixed-seed mix: prompts of ~30 to ~400 tokens, replies of 32 to 256 tokens."""
    rng = random.Random(seed)
    requests = []
    for _ in range(n):
        ask = rng.choice(ASKS).format(rng.choice(TOPICS))
        context = CONTEXT * rng.choice([0, 0, 1, 2, 4, 8])
        messages = [{"role": "user", "content": (context + ask).strip()}]
        requests.append(Request(encode_chat(tokenizer, messages), rng.randint(32, 256)))
    return requests


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def run_engine(engine: LLMEngine, requests: list[Request], label: str) -> RunResult:
    start = time.monotonic()
    for i, r in enumerate(requests):
        engine.add_request(f"{label}-{i}", r.prompt_token_ids,
                           SamplingParams(temperature=0, max_tokens=r.max_tokens, ignore_eos=True))
    finished = []
    while engine.has_unfinished_requests():
        finished += [o for o in engine.step() if o.finished]
    seconds = time.monotonic() - start
    ttft = [o.metrics.first_token_time - start for o in finished]
    tpot = [(o.metrics.finished_time - o.metrics.first_token_time)
            / max(1, len(o.outputs[0].token_ids) - 1) for o in finished]
    tokens = sum(len(o.outputs[0].token_ids) for o in finished)
    return RunResult(label, len(requests), tokens, seconds, percentile(ttft, 0.5),
                     percentile(ttft, 0.99), percentile(tpot, 0.5))


def run_hf(model, requests: list[Request], batch_size: int, pad_id: int, label: str) -> RunResult:
    """Static batches, left padded, every row generating until the batch's longest is done."""
    start = time.monotonic()
    for b in range(0, len(requests), batch_size):
        batch = requests[b:b + batch_size]
        width = max(len(r.prompt_token_ids) for r in batch)
        ids = torch.full((len(batch), width), pad_id, dtype=torch.long)
        mask = torch.zeros((len(batch), width), dtype=torch.long)
        for i, r in enumerate(batch):
            ids[i, width - len(r.prompt_token_ids):] = torch.tensor(r.prompt_token_ids)
            mask[i, width - len(r.prompt_token_ids):] = 1
        new = max(r.max_tokens for r in batch)
        with torch.inference_mode():
            model.generate(input_ids=ids, attention_mask=mask, do_sample=False,
                           max_new_tokens=new, min_new_tokens=new, pad_token_id=pad_id)
    seconds = time.monotonic() - start
    # Only the tokens each request asked for count: padding rows' extra tokens are waste.
    return RunResult(label, len(requests), sum(r.max_tokens for r in requests), seconds)


def load_hf(loaded: LoadedModel):
    from transformers import AutoModelForCausalLM

    if loaded.path.suffix == ".gguf":  # transformers dequantizes it (about 20 s)
        model = AutoModelForCausalLM.from_pretrained(loaded.path.parent, gguf_file=loaded.path.name,
                                                     dtype=torch.float32)
    else:
        model = AutoModelForCausalLM.from_pretrained(loaded.path, dtype=torch.float32)
    model.generation_config.eos_token_id = None
    return model.eval()


def bench_concurrent(loaded, hf, n: int, seed: int, config: EngineConfig) -> list[RunResult]:
    requests = make_workload(loaded.tokenizer, n, seed)
    engine = LLMEngine(config=config, loaded=loaded)
    run_engine(engine, requests[:2], "warmup")
    ours = run_engine(engine, requests, f"pagoda, {n} concurrent")
    results = [ours]
    if hf is not None:
        pad = loaded.tokenizer.pad_token_id or 0
        results.append(run_hf(hf, requests, 8, pad, f"HF generate, {n} in static batches of 8"))
    return results


def bench_single(loaded, hf, config: EngineConfig, max_tokens: int = 128) -> list[RunResult]:
    request = make_workload(loaded.tokenizer, 1, 7)[0]
    request.max_tokens = max_tokens
    engine = LLMEngine(config=config, loaded=loaded)
    run_engine(engine, [request], "warmup")
    results = [run_engine(engine, [request], "pagoda, 1 stream")]
    if hf is not None:
        pad = loaded.tokenizer.pad_token_id or 0
        results.append(run_hf(hf, [request], 1, pad, "HF generate, batch 1"))
    return results


def bench_multiturn(loaded, config: EngineConfig, turns: int, caching: bool) -> list[float]:
    """TTFT of each turn of one conversation; replies are greedy and capped at 64 tokens."""
    config = replace(config, enable_prefix_caching=caching)
    engine = LLMEngine(config=config, loaded=loaded)
    rng = random.Random(3)
    messages, ttfts = [], []
    for turn in range(turns):
        ask = rng.choice(ASKS).format(rng.choice(TOPICS))
        messages.append({"role": "user", "content": f"{CONTEXT}{ask}"})
        prompt = encode_chat(loaded.tokenizer, messages)
        start = time.monotonic()
        engine.add_request(f"turn-{turn}", prompt, SamplingParams(temperature=0, max_tokens=64))
        final = None
        while engine.has_unfinished_requests():
            for out in engine.step():
                final = out
        ttfts.append(final.metrics.first_token_time - start)
        messages.append({"role": "assistant", "content": final.outputs[0].text})
    return ttfts


def describe_machine() -> str:
    return (f"{cpu_name()}, {torch.get_num_threads()} threads, torch {torch.__version__}, "
            f"Python {platform.python_version()}, fp32")


def print_table(results: list[RunResult], baseline: dict[int, RunResult]) -> None:
    print("| run | requests | output tokens | seconds | output tok/s | vs HF | TTFT p50 | "
          "TTFT p99 | TPOT p50 |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r in results:
        base = baseline.get(r.num_requests)
        ratio = f"{r.tok_per_s / base.tok_per_s:.2f}x" if base and base is not r else ""
        ms = lambda v: "" if v is None else f"{v * 1000:.0f} ms"
        print(f"| {r.label} | {r.num_requests} | {r.output_tokens} | {r.seconds:.1f} | "
              f"{r.tok_per_s:.1f} | {ratio} | {ms(r.ttft_p50)} | {ms(r.ttft_p99)} | "
              f"{ms(r.tpot_p50)} |")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default=None, help="model folder or .gguf (default: SmolLM2)")
    parser.add_argument("--concurrency", type=int, nargs="+", default=[32, 64])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--turns", type=int, default=10)
    parser.add_argument("--no-hf", action="store_true", help="skip the transformers baseline")
    parser.add_argument("--skip", nargs="*", default=[], choices=["concurrent", "single",
                                                                 "multiturn"])
    parser.add_argument("--json", help="also write the results to this file")
    args = parser.parse_args(argv)

    config = EngineConfig()
    torch.set_num_threads(config.resolved_num_threads())
    loaded = load_model(args.model)
    hf = None if args.no_hf else load_hf(loaded)
    print(f"Machine: {describe_machine()}\nModel: {loaded.name}\n")
    results: list[RunResult] = []
    if "concurrent" not in args.skip:
        for n in args.concurrency:
            results += bench_concurrent(loaded, hf, n, args.seed, config)
    if "single" not in args.skip:
        results += bench_single(loaded, hf, config)
    baseline = {r.num_requests: r for r in results if r.label.startswith("HF")}
    print_table(results, baseline)
    report = {"machine": describe_machine(), "results": [asdict(r) for r in results]}
    if "multiturn" not in args.skip:
        on = bench_multiturn(loaded, config, args.turns, caching=True)
        off = bench_multiturn(loaded, config, args.turns, caching=False)
        print("\n| turn | TTFT, prefix caching on | TTFT, off | speedup |\n|---|---|---|---|")
        for i, (a, b) in enumerate(zip(on, off, strict=True), 1):
            print(f"| {i} | {a * 1000:.0f} ms | {b * 1000:.0f} ms | {b / a:.1f}x |")
        report["multiturn"] = {"ttft_on": on, "ttft_off": off}
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=2)


if __name__ == "__main__":
    main()
