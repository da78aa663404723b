"""A mixture-of-experts GGUF file, our engine in-process against llama.cpp's server on the same
file, alternating, three rounds: one stream's decode, eight concurrent streams' aggregate decode,
a 1,000-token prefill, and each side's resident memory with the model loaded.

Not a test: run on a quiet machine and copy the table into docs/BENCHMARKS.md.

    python bench/moe_vs_llama_cpp.py MODEL.gguf [LLAMA_SERVER]

llama.cpp's figures are its own `timings` (HTTP not counted); eight streams are eight requests
at once to a server with eight slots, timed from the first request sent to the last answer.
Ours: `LLM.generate` (decode = the time of 128 tokens less that of 1; eight streams = eight
prompts in one call, 128 tokens each, over its wall time). Resident memory is each process's
VmRSS after the runs: both memory-map the file, so pages of the file that were read count on
both sides.
"""
import json
import statistics
import subprocess
import sys
import threading
import time
import urllib.request

from cpu_info import cpu_name

from engine.worker.process_memory import resident_bytes

G = sys.argv[1]
BIN = sys.argv[2] if len(sys.argv) > 2 else "/work/llama.cpp-build/build/bin/llama-server"
PORT = 8392
STREAMS = 8
TOKENS = 128
WORDS = ["the", "keeper", "climbed", "the", "stairs", "of", "the", "old", "lighthouse", "while",
         "the", "storm", "rolled", "in", "from", "the", "west", "and", "the", "sea", "threw",
         "itself", "against", "the", "rocks", "below"]


def text(i: int, n: int) -> str:
    return f"Request {i}: " + " ".join(WORDS[j % len(WORDS)] for j in range(n))


def post(body: dict) -> dict:
    req = urllib.request.Request(f"http://127.0.0.1:{PORT}/completion", json.dumps(body).encode(),
                                 {"Content-Type": "application/json"})
    return json.loads(urllib.request.urlopen(req, timeout=1200).read())


def start_server() -> subprocess.Popen:
    server = subprocess.Popen(
        [BIN, "-m", G, "-t", "2", "--port", str(PORT), "-c", str(4096 * STREAMS // 2),
         "-np", str(STREAMS)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    for _ in range(600):
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{PORT}/health", timeout=1)
            return server
        except OSError:  # not listening (or still loading) yet
            time.sleep(1)
    raise RuntimeError("llama-server did not come up")


def resident_of(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        line = next(line for line in f if line.startswith("VmRSS:"))
    return int(line.split()[1]) * 1024


def llama_cpp_concurrent(r: int) -> float:
    bodies = [{"prompt": f"Story {r}-{i}: once upon a time", "n_predict": TOKENS,
               "ignore_eos": True, "cache_prompt": False, "temperature": 0}
              for i in range(STREAMS)]
    outs: list[dict] = [{}] * STREAMS

    def run(i: int) -> None:
        outs[i] = post(bodies[i])

    threads = [threading.Thread(target=run, args=(i,)) for i in range(STREAMS)]
    t = time.perf_counter()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    elapsed = time.perf_counter() - t
    return sum(o["timings"]["predicted_n"] for o in outs) / elapsed


def main() -> None:
    server = start_server()
    from engine import LLM, SamplingParams

    llm = LLM(G, num_threads=2)
    tok = llm.engine.tokenizer if hasattr(llm.engine, "tokenizer") else llm.tokenizer
    rows: dict[str, list[float]] = {k: [] for k in (
        "ours decode, 1 stream", "llama.cpp decode, 1 stream",
        f"ours decode, {STREAMS} streams", f"llama.cpp decode, {STREAMS} streams",
        "ours prefill", "llama.cpp prefill")}
    llm.generate(["warm up"], SamplingParams(temperature=0, max_tokens=8, ignore_eos=True))
    post({"prompt": "warm up", "n_predict": 8})
    greedy = SamplingParams(temperature=0, max_tokens=TOKENS, ignore_eos=True)
    for r in range(3):
        prompt = f"The capital of country {r} is"
        t = time.perf_counter()
        llm.generate([prompt], SamplingParams(temperature=0, max_tokens=1))
        t1 = time.perf_counter() - t
        t = time.perf_counter()
        llm.generate([prompt], greedy)
        rows["ours decode, 1 stream"].append((TOKENS - 1) / (time.perf_counter() - t - t1))
        out = post({"prompt": prompt, "n_predict": TOKENS, "ignore_eos": True,
                    "cache_prompt": False, "temperature": 0})
        rows["llama.cpp decode, 1 stream"].append(out["timings"]["predicted_per_second"])
        prompts = [f"Story {r}-{i}: once upon a time" for i in range(STREAMS)]
        t = time.perf_counter()
        llm.generate(prompts, greedy)
        rows[f"ours decode, {STREAMS} streams"].append(
            STREAMS * TOKENS / (time.perf_counter() - t))
        rows[f"llama.cpp decode, {STREAMS} streams"].append(llama_cpp_concurrent(r))
        ids = tok.encode(text(100 + r, 1000))[:1000]
        t = time.perf_counter()
        llm.generate([ids], SamplingParams(temperature=0, max_tokens=1))
        rows["ours prefill"].append(len(ids) / (time.perf_counter() - t))
        out = post({"prompt": ids, "n_predict": 1, "cache_prompt": False})
        rows["llama.cpp prefill"].append(out["timings"]["prompt_per_second"])
        print(r, {k: round(v[-1], 1) for k, v in rows.items()}, flush=True)
    ours_rss, theirs_rss = resident_bytes(), resident_of(server.pid)
    server.terminate()
    print(f"CPU: {cpu_name()}, 2 threads; file {G}; prefill prompt {len(ids)} tokens")
    print("| figure | median | rounds |\n|---|---|---|")
    for k, v in rows.items():
        print(f"| {k} | {statistics.median(v):.1f} tok/s | {', '.join(f'{x:.1f}' for x in v)} |")
    print(f"| resident memory, ours | {ours_rss / 2**30:.2f} GiB | |")
    print(f"| resident memory, llama.cpp | {theirs_rss / 2**30:.2f} GiB | |")


if __name__ == "__main__":
    main()
