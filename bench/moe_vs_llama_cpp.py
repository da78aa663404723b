"""A GGUF file (written for the mixtures of experts; any family runs), our engine in-process
against llama.cpp's server on the same file, alternating, three rounds: one stream's decode,
eight concurrent streams' aggregate decode, a 1,000-token prefill (--prefill-tokens), and each
side's resident memory with the model loaded.

Not a test: run on a quiet machine and copy the table into docs/BENCHMARKS.md.

    python bench/moe_vs_llama_cpp.py MODEL.gguf [--server LLAMA_SERVER] [--rounds 3] [--alone]
        [--prefill-tokens N]

--alone runs each side by itself, ours first, the server after ours has exited: for a file
that fits this machine's memory once but not beside a second process's copy (llama.cpp repacks
some types into memory of its own at load).

llama.cpp's figures are its own `timings` (HTTP not counted); eight streams are eight requests
at once to a server with eight slots, timed from the first request sent to the last answer.
Ours: `LLM.generate` (decode = the time of 128 tokens less that of 1; eight streams = eight
prompts in one call, 128 tokens each, over its wall time). Resident memory is each process's
VmRSS after the runs: both memory-map the file, so pages of the file that were read count on
both sides.
"""
import argparse
import json
import statistics
import subprocess
import threading
import time
import urllib.request
from collections import defaultdict

from cpu_info import cpu_name

from pagoda.engine.worker.process_memory import resident_bytes

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


def start_server(model: str, binary: str) -> subprocess.Popen:
    server = subprocess.Popen(
        [binary, "-m", model, "-t", "2", "--port", str(PORT), "-c", str(4096 * STREAMS // 2),
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


class LlamaCpp:
    """llama.cpp's server on the file: its own timings."""

    name = "llama.cpp"

    def __init__(self, model: str, binary: str) -> None:
        self.server = start_server(model, binary)
        post({"prompt": "warm up", "n_predict": 8})

    def one_stream(self, prompt: str) -> float:
        out = post({"prompt": prompt, "n_predict": TOKENS, "ignore_eos": True,
                    "cache_prompt": False, "temperature": 0})
        return out["timings"]["predicted_per_second"]

    def streams(self, prompts: list[str]) -> float:
        outs: list[dict] = [{}] * len(prompts)

        def run(i: int) -> None:
            outs[i] = post({"prompt": prompts[i], "n_predict": TOKENS, "ignore_eos": True,
                            "cache_prompt": False, "temperature": 0})

        threads = [threading.Thread(target=run, args=(i,)) for i in range(len(prompts))]
        t = time.perf_counter()
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        elapsed = time.perf_counter() - t
        return sum(o["timings"]["predicted_n"] for o in outs) / elapsed

    def prefill(self, ids: list[int]) -> float:
        out = post({"prompt": ids, "n_predict": 1, "cache_prompt": False})
        return out["timings"]["prompt_per_second"]

    def resident(self) -> int:
        return resident_of(self.server.pid)

    def close(self) -> None:
        self.server.terminate()
        self.server.wait()


class Ours:
    """Our engine in this process (`LLM.generate`)."""

    name = "ours"

    def __init__(self, model: str) -> None:
        from pagoda.engine import LLM, SamplingParams

        self.params = SamplingParams
        t = time.perf_counter()
        self.llm = LLM(model, num_threads=2)
        print(f"ours: loaded in {time.perf_counter() - t:.1f} s", flush=True)
        self.greedy = SamplingParams(temperature=0, max_tokens=TOKENS, ignore_eos=True)
        self.llm.generate(["warm up"], SamplingParams(temperature=0, max_tokens=8,
                                                      ignore_eos=True))

    def one_stream(self, prompt: str) -> float:
        t = time.perf_counter()
        self.llm.generate([prompt], self.params(temperature=0, max_tokens=1))
        first = time.perf_counter() - t
        t = time.perf_counter()
        self.llm.generate([prompt], self.greedy)
        return (TOKENS - 1) / (time.perf_counter() - t - first)

    def streams(self, prompts: list[str]) -> float:
        t = time.perf_counter()
        self.llm.generate(prompts, self.greedy)
        return len(prompts) * TOKENS / (time.perf_counter() - t)

    def prefill(self, ids: list[int]) -> float:
        t = time.perf_counter()
        self.llm.generate([ids], self.params(temperature=0, max_tokens=1))
        return len(ids) / (time.perf_counter() - t)

    def prompts(self, rounds: int, length: int) -> list[list[int]]:
        """Each round's own prompt of `length` tokens by the file's tokenizer (both sides get
        ids): a prompt seen in an earlier round would be a prefix-cache hit."""
        engine = self.llm.engine
        tokenizer = engine.tokenizer if hasattr(engine, "tokenizer") else self.llm.tokenizer
        return [tokenizer.encode(text(100 + r, length))[:length] for r in range(rounds)]

    def resident(self) -> int:
        return resident_bytes()

    def close(self) -> None:
        self.llm = None


def measure(side, rows: dict[str, list[float]], r: int, ids: list[int]) -> None:
    rows[f"{side.name} decode, 1 stream"].append(side.one_stream(f"The capital of country {r} is"))
    prompts = [f"Story {r}-{i}: once upon a time" for i in range(STREAMS)]
    rows[f"{side.name} decode, {STREAMS} streams"].append(side.streams(prompts))
    rows[f"{side.name} prefill"].append(side.prefill(ids))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("model")
    parser.add_argument("--server", default="/work/llama.cpp-build/build/bin/llama-server")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--alone", action="store_true")
    parser.add_argument("--prefill-tokens", type=int, default=1000,
                        help="the prefill prompt's length (default 1,000)")
    args = parser.parse_args()
    ids: list[list[int]] = []
    rows: dict[str, list[float]] = defaultdict(list)
    resident: dict[str, int] = {}
    makers = [lambda: Ours(args.model), lambda: LlamaCpp(args.model, args.server)]
    groups = [[make] for make in makers] if args.alone else [makers]
    for group in groups:
        sides = [make() for make in group]
        ids = ids or sides[0].prompts(args.rounds, args.prefill_tokens)  # ours is made first
        for r in range(args.rounds):
            for side in sides:
                measure(side, rows, r, ids[r])
            print(r, {k: round(v[-1], 1) for k, v in rows.items()}, flush=True)
        for side in sides:
            resident[side.name] = side.resident()
            side.close()
    print(f"CPU: {cpu_name()}, 2 threads; file {args.model}; prefill prompt {len(ids[0])} "
          f"tokens; {'each side alone' if args.alone else 'both sides loaded, alternating'}")
    print("| figure | median | rounds |\n|---|---|---|")
    for k in sorted(rows, key=lambda k: (k.split(" ", 1)[1], k)):
        v = rows[k]
        print(f"| {k} | {statistics.median(v):.1f} tok/s | {', '.join(f'{x:.1f}' for x in v)} |")
    for name, value in resident.items():
        print(f"| resident memory, {name} | {value / 2**30:.2f} GiB | |")


if __name__ == "__main__":
    main()
