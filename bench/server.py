"""The HTTP server's cost: the same streaming requests in-process and through /v1/completions.

Not a test: run `python bench/server.py` on a quiet machine and copy the table into
docs/BENCHMARKS.md. Both paths share one AsyncEngine and one workload (token-id prompts,
greedy, ignore_eos, so every request makes exactly its max_tokens); runs alternate in-process and
HTTP so drift of the machine falls on both. The prefix cache is emptied between runs.

  concurrent  N streaming clients at once: aggregate output tok/s, median TTFT
  single      one request alone, repeated: the time to first token the HTTP layer adds
  --peer-url  the same concurrent workload against another OpenAI-compatible server (llama.cpp's
              `llama-server`, say), as one more row; it must serve the same model
"""

from __future__ import annotations

import argparse
import asyncio
import json
import platform
import statistics
import time
from dataclasses import dataclass, replace

import httpx
from throughput import make_workload

from engine import AsyncEngine, EngineConfig, SamplingParams
from engine.server.api import build_app
from engine.server.runner import ServerThread
from engine.server.served import ServedModel


@dataclass(slots=True)
class Run:
    label: str
    tokens: int
    seconds: float
    ttft: list[float]

    @property
    def tok_per_s(self) -> float:
        return self.tokens / self.seconds


async def one_in_process(engine: AsyncEngine, prompt: list[int], max_tokens: int,
                         ) -> tuple[float, int]:
    params = SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True)
    start = time.monotonic()
    first, tokens = None, 0
    async for out in engine.stream(prompt, params):
        first = first or time.monotonic() - start
        tokens = len(out.outputs[0].token_ids)
    return first, tokens


async def one_http(client: httpx.AsyncClient, url: str, model: str, prompt: list[int],
                   max_tokens: int) -> tuple[float, int]:
    body = {"model": model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0,
            "ignore_eos": True, "stream": True, "stream_options": {"include_usage": True}}
    start = time.monotonic()
    first, tokens = None, 0
    async with client.stream("POST", f"{url}/v1/completions", json=body) as response:
        response.raise_for_status()
        async for line in response.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            if chunk.get("choices") and chunk["choices"][0].get("text"):
                first = first or time.monotonic() - start
            if chunk.get("usage"):
                tokens = chunk["usage"]["completion_tokens"]
    return first, tokens


async def concurrent(label: str, requests, run_one) -> Run:
    start = time.monotonic()
    results = await asyncio.gather(*(run_one(r.prompt_token_ids, r.max_tokens) for r in requests))
    seconds = time.monotonic() - start
    return Run(label, sum(n for _, n in results), seconds, [t for t, _ in results])


def salted(requests, salt: int):
    """The requests with one distinct leading token per run, so no run reuses another's cached
    prefixes (within a run, shared prefixes are cached alike on both paths)."""
    return [replace(r, prompt_token_ids=[1000 + salt, *r.prompt_token_ids]) for r in requests]


async def bench(args) -> list[Run]:
    engine = AsyncEngine(args.model, EngineConfig(max_num_seqs=args.clients))
    name = engine.engine.loaded.name
    served = ServedModel(name, engine, engine.engine.max_model_len)
    server = ServerThread(build_app(lambda: served)).start()
    requests = make_workload(engine.tokenizer, args.clients, seed=0)
    for r in requests:
        r.max_tokens = min(r.max_tokens, args.max_tokens)
    runs: list[Run] = []
    limits = httpx.Limits(max_connections=args.clients + 4)
    async with httpx.AsyncClient(timeout=600, limits=limits) as client:
        def in_process(p, n):
            return one_in_process(engine, p, n)

        def over_http(p, n):
            return one_http(client, server.url, name, p, n)

        salts = iter(range(10_000))
        await concurrent("warm-up", salted(requests[:4], next(salts)), in_process)
        for _ in range(args.repeats):
            for label, run_one in (("in-process", in_process), ("HTTP", over_http)):
                runs.append(await concurrent(f"{label}, {args.clients} streams",
                                             salted(requests, next(salts)), run_one))
        for label, run_one in (("in-process", in_process), ("HTTP", over_http)):
            ttft = []
            for _ in range(args.single):
                single = salted(requests[:1], next(salts))[0]
                ttft.append((await run_one(single.prompt_token_ids, 8))[0])
            runs.append(Run(f"{label}, one request alone", 0, 1.0, ttft))
        if args.peer_url:
            async def peer(p, n):
                return await one_http(client, args.peer_url, args.peer_model or name, p, n)
            runs.append(await concurrent(f"peer {args.peer_url}, {args.clients} streams",
                                         salted(requests, next(salts)), peer))
    server.stop()
    engine.shutdown()
    return runs


def cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            return next(line.split(":", 1)[1].strip() for line in f
                        if line.startswith("model name"))
    except (OSError, StopIteration):
        return platform.processor() or platform.machine()


def report(runs: list[Run], args) -> None:
    print(f"\n{cpu_name()}, {args.clients} clients, up to {args.max_tokens} tokens each\n")
    print("| run | output tok/s | median TTFT (ms) |")
    print("|---|---|---|")
    for run in runs:
        rate = f"{run.tok_per_s:.1f}" if run.tokens else "-"
        print(f"| {run.label} | {rate} | {statistics.median(run.ttft) * 1000:.1f} |")
    pairs = [(a, b) for a, b in zip(runs[::2], runs[1::2], strict=False)
             if a.label.startswith("in-process") and b.label.startswith("HTTP")]
    for a, b in pairs:
        added_ms = (statistics.median(b.ttft) - statistics.median(a.ttft)) * 1000
        if a.tokens:
            print(f"\nHTTP / in-process throughput: {b.tok_per_s / a.tok_per_s:.3f}x; "
                  f"median TTFT added: {added_ms:.1f} ms")
        else:
            print(f"\nOne request alone, median TTFT added by HTTP: {added_ms:.1f} ms")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", help="model folder or .gguf (default: the bundled one)")
    parser.add_argument("--clients", type=int, default=32)
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=2, help="in-process/HTTP pairs")
    parser.add_argument("--single", type=int, default=10, help="repeats of the lone request")
    parser.add_argument("--peer-url", help="another OpenAI-compatible server, e.g. "
                                           "http://127.0.0.1:8080 (llama.cpp's llama-server)")
    parser.add_argument("--peer-model", help="the model name the peer expects")
    args = parser.parse_args()
    report(asyncio.run(bench(args)), args)


if __name__ == "__main__":
    main()
