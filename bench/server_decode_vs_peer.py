"""One stream through two OpenAI-compatible servers: `python -m pagoda.engine serve` and a peer serving
the same file (llama.cpp's `llama-server -m FILE -t 2`), by the completions endpoint (a base model
has no chat template), streamed by the `openai` client, three alternating rounds.

Not a test: run on a quiet machine and copy the table into docs/BENCHMARKS.md.

    python bench/server_decode_vs_peer.py MODEL.gguf PEER_URL/v1

Decode tok/s counts the streamed chunks after the first over the time after the first (128
tokens, ignore_eos); the first round warms both and is not in the median.
"""
import statistics
import subprocess
import sys
import time

import openai
from stream_paths import _free_port, _wait_for


def decode(url, n=128):
    c = openai.OpenAI(base_url=url, api_key="none", timeout=600)
    m = c.models.list().data[0].id
    first, count = None, 0
    for ch in c.completions.create(model=m, prompt="The history of the lighthouse", max_tokens=n,
                                   temperature=0, stream=True, extra_body={"ignore_eos": True}):
        if ch.choices and ch.choices[0].text:
            count += 1
            first = first or time.perf_counter()
    end = time.perf_counter()
    return (count - 1) / (end - first), count


def main() -> None:
    model = sys.argv[1]
    port = _free_port()
    ours = subprocess.Popen([sys.executable, "-m", "pagoda.engine", "serve", "--port", str(port), "--model", model],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}/v1"
    _wait_for(url, ours)
    res = {"Pagoda server": [], "llama.cpp server": []}
    try:
        for r in range(3):
            for name, u in (("Pagoda server", url), ("llama.cpp server", sys.argv[2])):
                res[name].append(decode(u))
                print(r, name, res[name][-1], flush=True)
    finally:
        ours.terminate()
        ours.wait(30)
    for name, v in res.items():
        print(f"| {name} | {statistics.median(x for x, _ in v[1:]):.1f} tok/s | chunks {v[-1][1]} |")


if __name__ == "__main__":
    main()
