"""The HTTP server's cost: the same streaming requests in-process and through /v1/completions.

Not a test: run `python bench/server.py` on a quiet machine and copy the table into
docs/BENCHMARKS.md. Both paths share one AsyncEngine and one workload (token-id prompts,
greedy, ignore_eos, so every request makes exactly its max_tokens); runs alternate in-process and
HTTP so drift of the machine falls on both. The prefix cache is emptied between runs.

  concurrent  N streaming clients at once: aggregate output tok/s, median TTFT
  single      one request alone, repeated: the time to first token the HTTP layer adds
  --peer-url  the same concurrent workload against another OpenAI-compatible server (llama.cpp's
              `llama-server`, or `python -m llama_cpp.server --model X.gguf --n_threads 2
              --interrupt_requests False` with --peer-text), as one more row; same model
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import platform
import statistics
import time
from concurrent.futures import ProcessPoolExecutor
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
        if out.outputs[0].delta_text:  # as over HTTP: the first text a client can show
            first = first or time.monotonic() - start
        tokens = len(out.outputs[0].token_ids)
    return first, tokens


async def one_http(client: httpx.AsyncClient, url: str, model: str, prompt: list[int] | str,
                   max_tokens: int) -> tuple[float, int]:
    """A text prompt (for a peer that takes no token ids) asks for `min_tokens` instead of
    ignore_eos; without a usage chunk, tokens are counted as chunks (one token each)."""
    body = {"model": model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0,
            "stream": True, "stream_options": {"include_usage": True}}
    body.update({"min_tokens": max_tokens} if isinstance(prompt, str) else {"ignore_eos": True})
    start = time.monotonic()
    first, chunks, tokens = None, 0, None
    async with client.stream("POST", f"{url}/v1/completions", json=body) as response:
        response.raise_for_status()
        async for line in response.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            if chunk.get("choices") and chunk["choices"][0].get("text"):
                first = first or time.monotonic() - start
                chunks += 1
            if chunk.get("usage"):
                tokens = chunk["usage"]["completion_tokens"]
    return first, chunks if tokens is None else tokens


async def in_process_batch(engine: AsyncEngine, requests, at_once: bool,
                           ) -> tuple[float, list[tuple[float, int]]]:
    start = time.monotonic()
    if at_once:
        results = await asyncio.gather(*(one_in_process(engine, r.prompt_token_ids, r.max_tokens)
                                         for r in requests))
    else:
        results = [await one_in_process(engine, r.prompt_token_ids, r.max_tokens)
                   for r in requests]
    return time.monotonic() - start, results


def http_batch(url: str, model: str, prompts: list[tuple[list[int], int]], at_once: bool,
               ) -> tuple[float, list[tuple[float, int]]]:
    """Run in a client process of its own, as a real client is: its parsing then takes no
    time (nor the GIL) from the server and the engine."""
    async def run() -> tuple[float, list[tuple[float, int]]]:
        limits = httpx.Limits(max_connections=len(prompts) + 4)
        async with httpx.AsyncClient(timeout=600, limits=limits) as client:
            start = time.monotonic()
            if at_once:
                results = await asyncio.gather(*(one_http(client, url, model, p, n)
                                                 for p, n in prompts))
            else:
                results = [await one_http(client, url, model, p, n) for p, n in prompts]
            return time.monotonic() - start, results
    return asyncio.run(run())


def salted(requests, salt: int):
    """The requests with one distinct leading token per run, so no run reuses another's cached
    prefixes (within a run, shared prefixes are cached alike on both paths)."""
    return [replace(r, prompt_token_ids=[1000 + salt, *r.prompt_token_ids]) for r in requests]


def as_run(label: str, measured: tuple[float, list[tuple[float, int]]], counted: bool) -> Run:
    seconds, results = measured
    tokens = sum(n for _, n in results) if counted else 0
    return Run(label, tokens, seconds, [t for t, _ in results])


async def bench(args) -> list[Run]:
    engine = AsyncEngine(args.model, EngineConfig(max_num_seqs=args.clients))
    name = engine.engine.loaded.name
    served = ServedModel(name, engine, engine.engine.max_model_len)
    server = ServerThread(build_app(lambda: served)).start()
    requests = make_workload(engine.tokenizer, args.clients, seed=0)
    for r in requests:
        r.max_tokens = min(r.max_tokens, args.max_tokens)
    loop = asyncio.get_running_loop()
    client = ProcessPoolExecutor(max_workers=1, mp_context=multiprocessing.get_context("spawn"))
    salts = iter(range(10_000))

    async def over_http(url: str, model: str, batch, at_once: bool):
        prompts = [(r.prompt_token_ids, r.max_tokens) for r in batch]
        return await loop.run_in_executor(client, http_batch, url, model, prompts, at_once)

    runs: list[Run] = []
    await in_process_batch(engine, salted(requests[:4], next(salts)), True)  # warm-up
    await over_http(server.url, name, salted(requests[:4], next(salts)), True)
    for _ in range(args.repeats):
        runs.append(as_run(f"in-process, {args.clients} streams", await in_process_batch(
            engine, salted(requests, next(salts)), True), True))
        runs.append(as_run(f"HTTP, {args.clients} streams", await over_http(
            server.url, name, salted(requests, next(salts)), True), True))
    lone = [replace(salted(requests[:1], next(salts))[0], max_tokens=8)
            for _ in range(args.single)]
    lone_http = [replace(salted(requests[:1], next(salts))[0], max_tokens=8)
                 for _ in range(args.single)]
    runs.append(as_run("in-process, one request alone",
                       await in_process_batch(engine, lone, False), False))
    runs.append(as_run("HTTP, one request alone",
                       await over_http(server.url, name, lone_http, False), False))
    if args.peer_url:
        batch = salted(requests, next(salts))
        if args.peer_text:
            batch = [replace(r, prompt_token_ids=engine.tokenizer.decode(r.prompt_token_ids))
                     for r in batch]
        label = f"peer {args.peer_url}, {args.clients} streams"
        try:
            runs.append(as_run(label, await over_http(args.peer_url, args.peer_model or name,
                                                      batch, True), True))
        except httpx.HTTPError as error:
            print(f"{label}: failed: {error!r}")
    client.shutdown()
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
    parser.add_argument("--peer-text", action="store_true",
                        help="send the peer text prompts (llama-cpp-python's server takes no "
                             "token ids)")
    args = parser.parse_args()
    report(asyncio.run(bench(args)), args)


if __name__ == "__main__":
    main()
