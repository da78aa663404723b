"""One stream through every way in: `LLM`, `AsyncEngine`, the HTTP server and the window's backend.

Not a test: run `python bench/stream_paths.py` on a quiet machine and copy the table into
docs/BENCHMARKS.md. The same chat request (greedy, `ignore_eos`, so every reply is exactly
--max-tokens long) goes through each path, each in a fresh process of its own (a path must not
inherit another's threads: that is what this bench measures), in rounds that alternate the
paths so the machine's drift falls on all of them.

  llm             `LLM.generate` on the main thread: the engine's own speed
  async           `AsyncEngine(model)`: built and stepped on its engine thread (the server, the CLI)
  async-adopted   `AsyncEngine(engine=LLMEngine(...))`: built on the main thread, stepped on
                  the engine thread (how the window and the server ran before issue 26)
  window          the window's loader (pagoda.app.qt.models.engine_host) and its LocalBackend, on an asyncio loop
  http            `python -m pagoda.engine serve` in its own process, streamed by the `openai` client
  --peer-url      the same request against another OpenAI-compatible server (llama.cpp's
                  `llama-server -m FILE -t 2`), as one more row

Decode tok/s counts the tokens after the first over the time after the first; TTFT is the
first token's wait. The resident set is the serving process's VmRSS after its last reply.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import os
import socket
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import psutil
from cpu_info import cpu_name

from pagoda.engine.worker.process_memory import resident_bytes

PROMPT = "Write a long story about a lighthouse keeper and the storm that changed her life."
PATHS = ("llm", "async", "async-adopted", "window", "http")


@dataclass(slots=True)
class Sample:
    ttft: float
    decode_tok_per_s: float
    rss_bytes: int | None = None


def _timed(chunks) -> Sample:
    """chunks: (seconds since the request, tokens so far) for each streamed piece."""
    first_t, first_n = next((t, n) for t, n in chunks if n > 0)
    last_t, last_n = chunks[-1]
    return Sample(first_t, (last_n - first_n) / max(last_t - first_t, 1e-9))


def _params(max_tokens: int):
    from pagoda.engine import SamplingParams

    return SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True)


def _messages():
    return [{"role": "user", "content": PROMPT}]


def _run_llm(model, config, max_tokens: int, requests: int) -> list[Sample]:
    from pagoda.engine import LLMEngine
    from pagoda.engine.text.chat_template import encode_chat

    engine = LLMEngine(model, config)
    prompt = encode_chat(engine.tokenizer, _messages())
    samples = []
    for i in range(requests):
        engine.add_request(f"r{i}", prompt, _params(max_tokens))
        start, chunks = time.perf_counter(), []
        while engine.has_unfinished_requests():
            for out in engine.step():
                chunks.append((time.perf_counter() - start, len(out.outputs[0].token_ids)))
        samples.append(_timed(chunks))
    return samples


async def _stream_engine(engine, max_tokens: int, requests: int) -> list[Sample]:
    samples = []
    for _ in range(requests):
        start, chunks = time.perf_counter(), []
        async for out in engine.stream(_messages(), _params(max_tokens)):
            chunks.append((time.perf_counter() - start, len(out.outputs[0].token_ids)))
        samples.append(_timed(chunks))
    return samples


def _run_async(model, config, max_tokens: int, requests: int, adopted: bool) -> list[Sample]:
    from pagoda.engine import AsyncEngine, LLMEngine

    engine = (AsyncEngine(engine=LLMEngine(model, config)) if adopted
              else AsyncEngine(model, config))
    try:
        return asyncio.run(_stream_engine(engine, max_tokens, requests))
    finally:
        engine.shutdown()


def _run_window(model, config, max_tokens: int, requests: int) -> list[Sample]:
    from pagoda.app.backends.chat.local import LocalBackend
    from pagoda.app.backends.services.local_engine import make_local_engine
    from pagoda.app.backends.types import ChatMessage, SamplingOptions

    backend = LocalBackend(make_local_engine(model, config, lambda *_: None))
    # The window's options have no ignore_eos: a reply that ends early counts the tokens it has.
    options = SamplingOptions(temperature=0.0, max_tokens=max_tokens)

    async def run() -> list[Sample]:
        samples = []
        for _ in range(requests):
            start, chunks, n = time.perf_counter(), [], 0
            async for chunk in backend.stream([ChatMessage("user", PROMPT)], options):
                n = chunk.num_output_tokens or n + bool(chunk.delta_text)
                chunks.append((time.perf_counter() - start, n))
            samples.append(_timed(chunks))
        return samples

    try:
        return asyncio.run(run())
    finally:
        backend.shutdown()


def _in_process(path: str, model: str | None, max_tokens: int, requests: int,
                threads: int | None) -> list[Sample]:
    from pagoda.engine import EngineConfig

    config = EngineConfig(num_threads=threads)
    if path == "llm":
        samples = _run_llm(model, config, max_tokens, requests)
    elif path == "window":
        samples = _run_window(model, config, max_tokens, requests)
    else:
        samples = _run_async(model, config, max_tokens, requests, path == "async-adopted")
    samples[-1].rss_bytes = resident_bytes()
    return samples


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _stream_http(url: str, model: str, max_tokens: int, requests: int) -> list[Sample]:
    import openai

    client = openai.OpenAI(base_url=url, api_key="none", timeout=600)
    samples = []
    for _ in range(requests):
        start, chunks, n = time.perf_counter(), [], 0
        stream = client.chat.completions.create(
            model=model, messages=_messages(), max_tokens=max_tokens, temperature=0, stream=True,
            stream_options={"include_usage": True}, extra_body={"ignore_eos": True})
        for chunk in stream:
            if chunk.choices and chunk.choices[0].delta.content:
                n += 1  # one streamed piece per token on both servers
                chunks.append((time.perf_counter() - start, n))
        samples.append(_timed(chunks))
    return samples


def _wait_for(url: str, server: subprocess.Popen, timeout: float = 300) -> str:
    import httpx

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if server.poll() is not None:
            raise RuntimeError(f"the server exited with {server.returncode}")
        try:
            return httpx.get(f"{url}/models", timeout=2).json()["data"][0]["id"]
        except (httpx.HTTPError, KeyError, IndexError, ValueError):
            time.sleep(0.5)
    raise RuntimeError(f"no server at {url} after {timeout} s")


def _run_http(model: str | None, max_tokens: int, requests: int) -> list[Sample]:
    port = _free_port()
    command = [sys.executable, "-m", "pagoda.engine", "serve", "--port", str(port)]
    server = subprocess.Popen(command + (["--model", model] if model else []),
                              cwd=Path(__file__).resolve().parent.parent)
    try:
        url = f"http://127.0.0.1:{port}/v1"
        samples = _stream_http(url, _wait_for(url, server), max_tokens, requests)
        samples[-1].rss_bytes = psutil.Process(server.pid).memory_info().rss
        return samples
    finally:
        server.terminate()
        server.wait(30)


def _one_round(path: str, args) -> list[Sample]:
    if path == "http":
        return _run_http(args.model, args.max_tokens, args.requests)
    context = multiprocessing.get_context("spawn")
    with context.Pool(1) as pool:
        return pool.apply(_in_process, (path, args.model, args.max_tokens, args.requests,
                                        args.threads))


def _summary(label: str, measured: list[Sample]) -> dict:
    rss = [s.rss_bytes for s in measured if s.rss_bytes]
    return {"path": label, "requests": len(measured),
            "decode_tok_per_s": statistics.median(s.decode_tok_per_s for s in measured),
            "decode_min": min(s.decode_tok_per_s for s in measured),
            "decode_max": max(s.decode_tok_per_s for s in measured),
            "ttft_ms": 1000 * statistics.median(s.ttft for s in measured),
            "rss_gb": max(rss) / 1e9 if rss else None}


def report(rows: list[dict], args) -> None:
    print(f"\nCPU: {cpu_name()}, {os.cpu_count()} cores; {args.max_tokens} greedy tokens, "
          f"ignore_eos; {args.rounds} rounds x {args.requests} requests per path (the first of "
          "each round not counted)\n")
    print("| path | decode tok/s (median) | min-max | TTFT p50 | resident set |")
    print("|---|---|---|---|---|")
    for r in rows:
        rss = f"{r['rss_gb']:.2f} GB" if r["rss_gb"] else ""
        print(f"| {r['path']} | {r['decode_tok_per_s']:.1f} | {r['decode_min']:.1f}-"
              f"{r['decode_max']:.1f} | {r['ttft_ms']:.0f} ms | {rss} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default=None, help="a GGUF file or HF folder (default: bundled)")
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--requests", type=int, default=3,
                        help="per path per round, at least 2 (the first warms up)")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--paths", nargs="+", default=list(PATHS), choices=PATHS)
    parser.add_argument("--peer-url", help="another server's /v1 URL, e.g. llama.cpp's")
    parser.add_argument("--threads", type=int,
                        help="torch threads of the in-process paths (default: every core)")
    parser.add_argument("--json", help="also write the rows to this file")
    args = parser.parse_args()
    if args.threads and "http" in args.paths:
        parser.error("--threads applies to the in-process paths; leave out http")
    if args.requests < 2:
        parser.error("--requests must be at least 2: the first of each round is not counted")
    results: dict[str, list[Sample]] = {}
    for _ in range(args.rounds):
        for path in args.paths:
            # The first request of each process warms it: not counted.
            results.setdefault(path, []).extend(_one_round(path, args)[1:])
            print(f"{path}: {_summary(path, results[path])['decode_tok_per_s']:.1f} tok/s",
                  file=sys.stderr, flush=True)
        if args.peer_url:
            import httpx

            model = httpx.get(f"{args.peer_url}/models", timeout=5).json()["data"][0]["id"]
            results.setdefault("peer", []).extend(
                _stream_http(args.peer_url, model, args.max_tokens, args.requests)[1:])
    rows = [_summary(path, samples) for path, samples in results.items()]
    report(rows, args)
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
