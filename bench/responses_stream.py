"""What /v1/responses' and /v1/messages' typed events cost over /v1/chat/completions' chunks,
streaming the same greedy reply from the same server.

Not a test: run `python bench/responses_stream.py` on a quiet machine. Each round streams one
request to each endpoint (the order alternates, so drift falls on both) and reads the raw SSE
bytes with httpx, so the client's parsing is not counted; both replies are the same tokens (same
prompt, temperature 0), so the difference is the server's conversion and the bytes sent.
"""

from __future__ import annotations

import argparse
import statistics
import time

import httpx
from cpu_info import cpu_name

from pagoda.engine import AsyncEngine
from pagoda.engine.server.api import build_app
from pagoda.engine.server.runner import ServerThread
from pagoda.engine.server.served import ServedModel

PROMPT = "Count from one to one hundred in words, separated by commas."


def stream(client: httpx.Client, path: str, body: dict) -> tuple[float, int, int]:
    """Seconds to the last byte, bytes read and `data:` lines read."""
    start = time.perf_counter()
    size = lines = 0
    with client.stream("POST", path, json=body) as response:
        response.raise_for_status()
        for line in response.iter_lines():
            size += len(line) + 1
            lines += line.startswith("data:")
    return time.perf_counter() - start, size, lines


def bodies(model: str, tokens: int) -> dict[str, tuple[str, dict]]:
    return {
        "chat": ("/v1/chat/completions", {
            "model": model, "messages": [{"role": "user", "content": PROMPT}], "stream": True,
            "temperature": 0, "max_tokens": tokens}),
        "responses": ("/v1/responses", {
            "model": model, "input": PROMPT, "stream": True, "temperature": 0,
            "max_output_tokens": tokens, "store": False}),
        "messages": ("/v1/messages", {
            "model": model, "messages": [{"role": "user", "content": PROMPT}], "stream": True,
            "temperature": 0, "max_tokens": tokens}),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--tokens", type=int, default=64)
    args = parser.parse_args()
    engine = AsyncEngine()
    served = ServedModel(engine.model_name, engine, engine.max_model_len)
    server = ServerThread(build_app(lambda: served)).start()
    asks = bodies(engine.model_name, args.tokens)
    seconds: dict[str, list[float]] = {name: [] for name in asks}
    sizes: dict[str, tuple[int, int]] = {}
    try:
        with httpx.Client(base_url=server.url, timeout=300) as client:
            for name, (path, body) in asks.items():  # warm both paths once
                stream(client, path, body)
            for round_ in range(args.rounds):
                shift = round_ % len(asks)  # each endpoint takes each place in turn
                order = list(asks)[shift:] + list(asks)[:shift]
                for name in order:
                    took, size, lines = stream(client, *asks[name])
                    seconds[name].append(took)
                    sizes[name] = (size, lines)
    finally:
        server.stop()
        engine.shutdown()
    print(f"{cpu_name()}: {args.rounds} alternating rounds, {args.tokens} tokens a reply")
    print("| endpoint | mean s | median s | tok/s vs chat (medians) | bytes | data lines |")
    print("|---|---|---|---|---|---|")
    chat = statistics.median(seconds["chat"])
    for name, times in seconds.items():
        size, lines = sizes[name]
        print(f"| {name} | {statistics.mean(times):.3f} | {statistics.median(times):.3f} | "
              f"{chat / statistics.median(times):.3f}x | {size:,} | {lines} |")


if __name__ == "__main__":
    main()
