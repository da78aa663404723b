"""Prefill speed: a long prompt's time to its first token, through `python -m pagoda.engine serve` and
another OpenAI-compatible server (llama.cpp's), the same requests to both.

Not a test: run on a quiet machine and copy the table into docs/BENCHMARKS.md.

    python bench/prefill.py --model FILE.gguf [--prompt-tokens 1200] [--peer-url URL/v1]

Each request is a different prompt of about --prompt-tokens tokens (its first words differ), so
neither server's prompt cache shortens it; max_tokens is 1, so the time is the prefill. Prompt
tokens per second are the server's own count (`usage.prompt_tokens`) over the wall time.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

from cpu_info import cpu_name
from stream_paths import _free_port, _wait_for

SENTENCE = ("the keeper climbed the stairs of the old lighthouse while the storm rolled in from "
            "the west and the sea threw itself against the rocks below")


def prompt(index: int, approx_tokens: int) -> str:
    """Distinct from its first word on, about one token per word."""
    words = SENTENCE.split()
    words = [f"Request {index}:"] + [words[i % len(words)] for i in range(approx_tokens)]
    return " ".join(words)


def measure(url: str, requests: int, approx_tokens: int, offset: int) -> list[tuple[int, float]]:
    """(prompt tokens, seconds) per request; the first, a warm-up, is not returned."""
    import openai

    client = openai.OpenAI(base_url=url, api_key="none", timeout=900)
    model = client.models.list().data[0].id
    results = []
    for i in range(requests + 1):
        start = time.perf_counter()
        reply = client.completions.create(model=model, prompt=prompt(offset + i, approx_tokens),
                                          max_tokens=1, temperature=0)
        results.append((reply.usage.prompt_tokens, time.perf_counter() - start))
    return results[1:]


def _our_server(model: str) -> tuple[subprocess.Popen, str]:
    port = _free_port()
    server = subprocess.Popen([sys.executable, "-m", "pagoda.engine", "serve", "--port", str(port),
                               "--model", model],
                              cwd=Path(__file__).resolve().parent.parent)
    url = f"http://127.0.0.1:{port}/v1"
    _wait_for(url, server)
    return server, url


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", required=True, help="the GGUF file both servers run")
    parser.add_argument("--prompt-tokens", type=int, default=1200)
    parser.add_argument("--requests", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--peer-url", help="llama.cpp's /v1 URL, serving the same file")
    args = parser.parse_args()
    rows: dict[str, list[tuple[int, float]]] = {}
    server, url = _our_server(args.model)
    try:
        for r in range(args.rounds):
            # Alternate the servers so drift falls on both; offsets keep every prompt new.
            offset = 1000 * (r + 1)
            rows.setdefault("Pagoda server", []).extend(
                measure(url, args.requests, args.prompt_tokens, offset))
            if args.peer_url:
                rows.setdefault("peer", []).extend(
                    measure(args.peer_url, args.requests, args.prompt_tokens, offset + 500))
    finally:
        server.terminate()
        server.wait(30)
    print(f"\nCPU: {cpu_name()}, {os.cpu_count()} cores; {Path(args.model).name}; "
          f"{args.rounds} rounds x {args.requests} prompts per server\n")
    print("| server | prompt tokens | prefill s (median) | prompt tok/s |")
    print("|---|---|---|---|")
    for name, samples in rows.items():
        tokens = statistics.median(t for t, _ in samples)
        seconds = statistics.median(s for _, s in samples)
        print(f"| {name} | {tokens:.0f} | {seconds:.2f} | {tokens / seconds:.0f} |")


if __name__ == "__main__":
    main()
