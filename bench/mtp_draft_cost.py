"""What a multi-token-prediction block's drafts cost: one stream decoding with speculation on
(its drafts made every step), the time of the runner's block pass per step beside the whole
step's (with --drafts k, its k - 1 chained passes apart), and how often its drafts are kept.

Not a test: run `python bench/mtp_draft_cost.py --model FILE` on a file with the block (bench/
qwen35_file.py --mtp makes a Qwen3.5-shaped one with random weights, whose drafts are seldom
kept). Each round runs the same greedy reply with speculation off and on (cost model, and every
draft verified), alternating; the machine's noise only adds time, so each setting keeps its
fastest round.
"""

from __future__ import annotations

import argparse
import time

import torch
from cpu_info import cpu_name

from pagoda.engine import EngineConfig, LLMEngine, SamplingParams
from pagoda.engine.loading.loader import load_model
from pagoda.engine.text.chat_template import encode_chat
from pagoda.engine.worker.calibration import _scratch_step

PROMPT = ("Answer by quoting the passage word for word.\n\nPassage: The lighthouse keeper "
          "climbed the spiral stairs every evening to light the lamp. Ships passing the rocky "
          "cape at night looked for its beam, and for thirty years none was lost while he kept "
          "it burning.\n\nQuestion: What did the keeper do every evening?")


class TimedBlock:
    """Wraps a runner's block pass, summing its seconds."""

    def __init__(self, runner) -> None:
        self.seconds, self.calls = 0.0, 0
        self._inner = runner._mtp_drafts
        runner._mtp_drafts = self

    def __call__(self, *args):
        began = time.perf_counter()
        drafts = self._inner(*args)
        self.seconds += time.perf_counter() - began
        self.calls += 1
        return drafts


def decode(engine: LLMEngine, prompt: list[int], max_tokens: int) -> tuple[list[int], float]:
    """The reply and its decode seconds (after the first token)."""
    engine.add_request("r", prompt, SamplingParams(temperature=0, max_tokens=max_tokens))
    tokens, first = [], None
    while engine.has_unfinished_requests():
        for out in engine.step():
            tokens = out.outputs[0].token_ids
            if first is None and tokens:
                first = time.perf_counter()
    return tokens, time.perf_counter() - first


def time_steps(engine: LLMEngine, repeats: int = 10) -> None:
    """The runner's steps by shape, fastest of `repeats` (robust to a busy machine): a plain
    decode, one verifying a draft, and the block's pass within them."""
    runner = engine.runner
    block = TimedBlock(runner)
    for drafts in range(runner.num_mtp_drafts + 1):
        step = _scratch_step(runner, [drafts])
        runner.execute(step)
        steps, passes, chained = [], [], []
        for _ in range(repeats):
            block.seconds = 0.0
            began = time.perf_counter()
            out = runner.execute(step)
            steps.append(time.perf_counter() - began)
            passes.append(block.seconds - out.draft_seconds)
            chained.append(out.draft_seconds)
        print(f"{drafts + 1}-row step: {min(steps) * 1e3:.1f} ms, the block's pass in it "
              f"{min(passes) * 1e3:.1f} ms, its {runner.num_mtp_drafts - 1} chained passes "
              f"{min(chained) * 1e3:.1f} ms (fastest of {repeats})")
    runner._mtp_drafts = block._inner


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", required=True)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--drafts", type=int, default=1, help="num_speculative_tokens")
    args = parser.parse_args()
    loaded = load_model(args.model, torch.float32)
    prompt = encode_chat(loaded.tokenizer, [{"role": "user", "content": PROMPT}])
    settings = {"off": EngineConfig(num_threads=args.threads),
                "mtp, cost model": EngineConfig(num_threads=args.threads,
                                                num_speculative_tokens=args.drafts),
                "mtp, every draft": EngineConfig(num_threads=args.threads,
                                                 num_speculative_tokens=args.drafts,
                                                 speculative_cost_model=False)}
    engines = {name: LLMEngine(config=config, loaded=loaded) for name, config in settings.items()}
    time_steps(engines["mtp, every draft"])
    blocks = {name: TimedBlock(e.runner) for name, e in engines.items()
              if e.runner.mtp_kv is not None}
    print(f"{args.model}: {cpu_name()}, torch {torch.__version__}, {args.threads} threads, "
          f"{args.max_tokens} tokens, {args.rounds} rounds")
    best: dict[str, list[float]] = {name: [] for name in engines}
    replies = {}
    for _ in range(args.rounds):
        for name, engine in engines.items():
            block = blocks.get(name)
            if block is not None:
                block.seconds, block.calls = 0.0, 0
            tokens, seconds = decode(engine, prompt, args.max_tokens)
            replies[name] = tokens
            best[name].append((len(tokens) - 1) / seconds)
            if block is not None:
                stats = engine.stats()
                made = (f"block {block.seconds / block.calls * 1e3:.1f} ms a step "
                        f"({block.calls} steps, {block.seconds / seconds:.0%} of the decode, "
                        f"{engine.runner.num_mtp_drafts} drafts a step at the end)"
                        if block.calls else "block stopped (its drafts do not pay)")
                print(f"{name}: {made}, {stats.spec_accepted_tokens}/"
                      f"{stats.spec_draft_tokens} drafts kept in all; {stats.spec_reason}")
    for name, rates in best.items():
        rates.sort()
        print(f"{name}: {rates[-1]:.2f} tok/s best, {rates[len(rates) // 2]:.2f} median "
              f"({', '.join(f'{r:.2f}' for r in rates)})")
    if any(reply != replies["off"] for reply in replies.values()):
        print("note: greedy replies differ between settings (quantized kernels' near ties)")


if __name__ == "__main__":
    main()
