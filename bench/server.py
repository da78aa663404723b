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
import contextvars
import json
import multiprocessing
import statistics
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, replace

import httpx
from cpu_info import cpu_name
from throughput import make_workload, percentile

from pagoda.engine import AsyncEngine, EngineConfig, SamplingParams
from pagoda.engine.server.api import build_app
from pagoda.engine.server.runner import ServerThread, settle_the_heap
from pagoda.engine.server.served import ServedModel


@dataclass(slots=True)
class Run:
    label: str
    tokens: int
    seconds: float
    ttft: list[float]
    # Per HTTP request: the server's own part of TTFT (arrival to the call into the engine, and
    # the engine's first text to the client reading it), and the client's send before that.
    added: list[float] | None = None
    client_send: list[float] | None = None

    @property
    def tok_per_s(self) -> float:
        return self.tokens / self.seconds


async def one_in_process(engine: AsyncEngine, prompt: list[int], max_tokens: int,
                         ) -> tuple[float, int, None, float]:
    params = SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True)
    start = time.monotonic()
    first, tokens = None, 0
    async for out in engine.stream(prompt, params):
        if out.outputs[0].delta_text:  # as over HTTP: the first text a client can show
            first = first or time.monotonic() - start
        tokens = len(out.outputs[0].token_ids)
    return first, tokens, None, start


# When the request reached the server's ASGI app; the handler's task inherits it.
ARRIVED: contextvars.ContextVar[float] = contextvars.ContextVar("arrived")


def arrival_noted(app):
    async def noted(scope, receive, send):
        ARRIVED.set(time.monotonic())
        await app(scope, receive, send)
    return noted


class EngineClock:
    """Stands in for the engine behind the server and notes, per request (time.monotonic, one
    clock for all processes here): when it reached the server, when the handler called into the
    engine, and when the engine's first text came back."""

    def __init__(self, engine: AsyncEngine) -> None:
        self.engine = engine
        self.arrived: dict[str, float] = {}
        self.called: dict[str, float] = {}
        self.first: dict[str, float] = {}

    async def stream(self, prompt, params=None, request_id=None):
        start = self.called[request_id] = time.monotonic()
        self.arrived[request_id] = ARRIVED.get(start)
        async for out in self.engine.stream(prompt, params, request_id):
            if out.outputs[0].delta_text and request_id not in self.first:
                self.first[request_id] = time.monotonic()
            yield out

    def __getattr__(self, name):
        return getattr(self.engine, name)


async def one_http(client: httpx.AsyncClient, url: str, model: str, prompt: list[int] | str,
                   max_tokens: int) -> tuple[float, int, str | None, float]:
    """A text prompt (for a peer that takes no token ids) asks for `min_tokens` instead of
    ignore_eos; without a usage chunk, tokens are counted as chunks (one token each)."""
    body = {"model": model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0,
            "stream": True, "stream_options": {"include_usage": True}}
    body.update({"min_tokens": max_tokens} if isinstance(prompt, str) else {"ignore_eos": True})
    start = time.monotonic()
    first, chunks, tokens, reply_id = None, 0, None, None
    async with client.stream("POST", f"{url}/v1/completions", json=body) as response:
        response.raise_for_status()
        async for line in response.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            reply_id = reply_id or chunk.get("id")
            if chunk.get("choices") and chunk["choices"][0].get("text"):
                first = first or time.monotonic() - start
                chunks += 1
            if chunk.get("usage"):
                tokens = chunk["usage"]["completion_tokens"]
    return first, chunks if tokens is None else tokens, reply_id, start


async def in_process_batch(engine: AsyncEngine, requests, at_once: bool,
                           ) -> tuple[float, list[tuple]]:
    start = time.monotonic()
    if at_once:
        results = await asyncio.gather(*(one_in_process(engine, r.prompt_token_ids, r.max_tokens)
                                         for r in requests))
    else:
        results = [await one_in_process(engine, r.prompt_token_ids, r.max_tokens)
                   for r in requests]
    return time.monotonic() - start, results


def http_batch(url: str, model: str, prompts: list[tuple[list[int], int]], at_once: bool,
               ) -> tuple[float, list[tuple]]:
    """Run in a client process of its own, as a real client is: its parsing then takes no
    time (nor the GIL) from the server and the engine."""
    async def run() -> tuple[float, list[tuple]]:
        limits = httpx.Limits(max_connections=len(prompts) + 4)
        async with httpx.AsyncClient(timeout=600, limits=limits) as client:
            # Open the connections first, as a client that keeps them (the openai client does)
            # has them: TCP set-up is not the server's time to first token.
            await asyncio.gather(*(client.get(f"{url}/v1/models") for _ in prompts))
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


def as_run(label: str, measured: tuple[float, list[tuple]], counted: bool,
           clock: EngineClock | None = None) -> Run:
    seconds, results = measured
    tokens = sum(n for _, n, _, _ in results) if counted else 0
    run = Run(label, tokens, seconds, [t for t, _, _, _ in results])
    if clock is not None:  # our server names its requests "<reply id>-<choice>"
        run.added, run.client_send = [], []
        for ttft, _, reply_id, sent in results:
            key = f"{reply_id}-0"
            intake = clock.called[key] - clock.arrived[key]
            delivery = sent + ttft - clock.first[key]
            run.added.append(intake + delivery)
            run.client_send.append(clock.arrived[key] - sent)
    return run


async def bench(args) -> list[Run]:
    engine = AsyncEngine(args.model, EngineConfig(max_num_seqs=args.clients))
    settle_the_heap()  # as `python -m pagoda.engine serve` does once its model has loaded
    name = engine.model_name
    clock = EngineClock(engine)
    served = ServedModel(name, clock, engine.max_model_len)
    server = ServerThread(arrival_noted(build_app(lambda: served))).start()
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
            server.url, name, salted(requests, next(salts)), True), True, clock))
    lone = [replace(salted(requests[:1], next(salts))[0], max_tokens=8)
            for _ in range(args.single)]
    lone_http = [replace(salted(requests[:1], next(salts))[0], max_tokens=8)
                 for _ in range(args.single)]
    runs.append(as_run("in-process, one request alone",
                       await in_process_batch(engine, lone, False), False))
    runs.append(as_run("HTTP, one request alone",
                       await over_http(server.url, name, lone_http, False), False, clock))
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


def report(runs: list[Run], args) -> None:
    print(f"\n{cpu_name()}, {args.clients} clients, up to {args.max_tokens} tokens each\n")
    print("| run | output tok/s | median TTFT (ms) | TTFT added by the server, median / p90 (ms) |")
    print("|---|---|---|---|")
    runs = [run for run in runs if run.ttft]  # `--single 0` makes empty runs
    for run in runs:
        rate = f"{run.tok_per_s:.1f}" if run.tokens else "-"
        added = "-"
        if run.added:
            added = f"{statistics.median(run.added) * 1000:.1f} / " \
                    f"{percentile(run.added, 0.9) * 1000:.1f}"
        print(f"| {run.label} | {rate} | {statistics.median(run.ttft) * 1000:.1f} | {added} |")
    pairs = [(a, b) for a, b in zip(runs[::2], runs[1::2], strict=False)
             if a.label.startswith("in-process") and b.label.startswith("HTTP") and a.tokens]
    for a, b in pairs:
        print(f"\nHTTP / in-process throughput: {b.tok_per_s / a.tok_per_s:.3f}x")
    print("\nTTFT added by the server: per request, from its arrival at the server to the call "
          "into the engine, plus from the engine's first text to the client reading it.")
    for run in runs:
        if run.client_send:
            print(f"{run.label}: the client's own sending (before the server sees the request) "
                  f"median {statistics.median(run.client_send) * 1e3:.1f} ms")


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
