"""A 7B-shaped Llama (Llama 2 7B's shapes) with random Q4_K weights: does it load in under 6 GB
and how fast does it decode on this CPU? Not a test (the file is 3.9 GB).

    python bench/big_model.py [--dir DIR] [--tokens 32]

Writes the GGUF file once (layers Q4_K, output Q6_K as in a Q4_K_M file; random blocks with
small scales, so the text is noise but every byte is read as in a real model), then, in a fresh
process, loads it with the engine and decodes one stream. Reports the load time, the peak and
final anonymous memory (the file itself is memory-mapped: its pages are the page cache's, not
the process's), and decode tok/s.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import threading
import time
from pathlib import Path

import gguf
import numpy as np
from gguf import GGMLQuantizationType as QType

VOCAB, HIDDEN, INTERMEDIATE, LAYERS, HEADS = 32000, 4096, 11008, 32, 32
SPECIALS = ("<unk>", "<s>", "</s>")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--dir", type=Path, default=Path("/tmp/pagoda-big-model"))
    parser.add_argument("--tokens", type=int, default=32)
    parser.add_argument("--measure", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.measure:
        print(json.dumps(measure(args.measure, args.tokens)))
        return
    path = args.dir / "llama-7b-shaped.Q4_K.gguf"
    if not path.is_file():
        write_model(path)
    out = subprocess.run([sys.executable, __file__, "--measure", str(path), "--tokens",
                          str(args.tokens)], capture_output=True, text=True, check=True)
    result = json.loads(out.stdout.strip().splitlines()[-1])
    print(f"file {path.stat().st_size / 2**30:.2f} GiB; " + ", ".join(
        f"{k} {v:.2f}" if isinstance(v, float) else f"{k} {v}" for k, v in result.items()))


def write_model(path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    writer = gguf.GGUFWriter(path, "llama")
    _add_config(writer)
    tensors = _tensor_list()
    for name, kind, rows, cols in tensors:
        if kind == QType.F32:
            writer.add_tensor_info(name, (cols,), np.dtype(np.float32), cols * 4)
        else:
            block, size = gguf.GGML_QUANT_SIZES[kind]
            writer.add_tensor_info(name, (rows, cols // block * size), np.dtype(np.uint8),
                                   rows * cols // block * size, raw_dtype=kind)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    for _, kind, rows, cols in tensors:
        if kind == QType.F32:
            writer.write_tensor_data(np.ones(cols, dtype=np.float32))
        else:
            writer.write_tensor_data(_random_blocks(kind, rows, cols, rng))
    writer.close()


def _add_config(writer: gguf.GGUFWriter) -> None:
    writer.add_name("llama-7b-shaped")
    writer.add_block_count(LAYERS)
    writer.add_context_length(4096)
    writer.add_embedding_length(HIDDEN)
    writer.add_feed_forward_length(INTERMEDIATE)
    writer.add_head_count(HEADS)
    writer.add_head_count_kv(HEADS)
    writer.add_rope_freq_base(10000.0)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_rope_dimension_count(HIDDEN // HEADS)
    writer.add_vocab_size(VOCAB)
    filler = [f"<t{i}>" for i in range(VOCAB - len(SPECIALS) - 256)]
    bytes_tokens = [f"<0x{b:02X}>" for b in range(256)]
    tokens = [*SPECIALS, *bytes_tokens, *filler]
    writer.add_tokenizer_model("llama")
    writer.add_token_list(tokens)
    writer.add_token_scores([0.0] * len(tokens))
    writer.add_token_types([3] * len(SPECIALS) + [6] * 256 + [1] * len(filler))
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)


def _tensor_list() -> list[tuple[str, QType, int, int]]:
    tensors = [("token_embd.weight", QType.Q4_K, VOCAB, HIDDEN),
               ("output_norm.weight", QType.F32, 1, HIDDEN),
               ("output.weight", QType.Q6_K, VOCAB, HIDDEN)]
    for i in range(LAYERS):
        tensors += [(f"blk.{i}.attn_q.weight", QType.Q4_K, HIDDEN, HIDDEN),
                    (f"blk.{i}.attn_k.weight", QType.Q4_K, HIDDEN, HIDDEN),
                    (f"blk.{i}.attn_v.weight", QType.Q4_K, HIDDEN, HIDDEN),
                    (f"blk.{i}.attn_output.weight", QType.Q4_K, HIDDEN, HIDDEN),
                    (f"blk.{i}.ffn_gate.weight", QType.Q4_K, INTERMEDIATE, HIDDEN),
                    (f"blk.{i}.ffn_up.weight", QType.Q4_K, INTERMEDIATE, HIDDEN),
                    (f"blk.{i}.ffn_down.weight", QType.Q4_K, HIDDEN, INTERMEDIATE),
                    (f"blk.{i}.attn_norm.weight", QType.F32, 1, HIDDEN),
                    (f"blk.{i}.ffn_norm.weight", QType.F32, 1, HIDDEN)]
    return tensors


def _random_blocks(kind: QType, rows: int, cols: int, rng: np.random.Generator) -> np.ndarray:
    """Random bits with every fp16 scale small and positive (d and dmin for Q4_K, d for Q6_K)."""
    block, size = gguf.GGML_QUANT_SIZES[kind]
    blocks = rng.integers(0, 256, size=(rows, cols // block, size), dtype=np.uint8)
    offsets = (0, 2) if kind == QType.Q4_K else (size - 2,)
    for offset in offsets:
        scales = rng.uniform(1e-4, 4e-4, size=blocks.shape[:2]).astype(np.float16)
        blocks[..., offset:offset + 2] = scales[..., None].view(np.uint8)
    return blocks.reshape(rows, -1)


def measure(path: Path, tokens: int) -> dict[str, float]:
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from pagoda.engine import EngineConfig, LLMEngine, SamplingParams

    peak = _PeakAnonymousMemory()
    start = time.perf_counter()
    engine = LLMEngine(str(path), EngineConfig(kv_cache_memory=512 << 20, max_model_len=2048))
    load_s = time.perf_counter() - start
    peak_anon = peak.stop()
    engine.add_request("one", list(range(10, 42)),
                       SamplingParams(temperature=0, max_tokens=tokens, ignore_eos=True))
    engine.step()  # the prompt
    start = time.perf_counter()
    while engine.has_unfinished_requests():
        engine.step()
    decode_s = time.perf_counter() - start
    status = _memory_status()
    return {"load_s": load_s, "decode_tok_per_s": (tokens - 1) / decode_s,
            "peak_rss_gib": status["VmHWM"] / 2**20, "peak_anon_gib": peak_anon / 2**20,
            "anon_gib_after_load": status["RssAnon"] / 2**20,
            "file_pages_gib": status["RssFile"] / 2**20}


class _PeakAnonymousMemory:
    """The largest RssAnon (KiB) seen while loading, sampled every 50 ms on a thread."""

    def __init__(self) -> None:
        self.peak = 0
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()

    def _sample(self) -> None:
        while not self._done.wait(0.05):
            self.peak = max(self.peak, _memory_status()["RssAnon"])

    def stop(self) -> int:
        self._done.set()
        self._thread.join()
        return self.peak


def _memory_status() -> dict[str, int]:
    """/proc/self/status figures in KiB."""
    fields = {}
    for line in Path("/proc/self/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if value.strip().endswith("kB"):
            fields[key] = int(value.split()[0])
    return fields


if __name__ == "__main__":
    main()
