"""Our C decode-step ops (pagoda/kernels/cpu/decode_ops.c) against torch_ref, in one process.

Not a test: `python bench/decode_ops.py` prints
1. per-op µs on the default model's shapes (one decode row; attention at several context
   lengths), C and torch interleaved round by round, best round of each;
2. one-stream decode of the default model through `LLM.chat` (greedy, 128 tokens, ignore_eos),
   an engine with our ops and one with PAGODA_NATIVE_KERNELS=0, chats alternating between them.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch
from cpu_info import cpu_name

sys.path.insert(0, str(Path(__file__).parents[1] / "tests" / "kernels"))
import test_decode_ops as shapes

from pagoda.engine.quantization.native_kernels import kernel_build_dir
from pagoda.kernels import torch_ref
from pagoda.kernels.cpu.decode_ops import DecodeOps

H, KV, D, HID, INTER, EPS = 9, 3, 64, 576, 1536, 1e-5


def _per_call_us(fn: Callable[[], object], calls: int = 200) -> float:
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    return (time.perf_counter() - start) / calls * 1e6


def op_pairs(lib: DecodeOps, context_lens: list[int]) -> dict[str, tuple[Callable, Callable]]:
    x, w, res = torch.randn(1, HID), torch.randn(HID), torch.randn(1, HID)
    qkv = torch.randn(1, (H + 2 * KV) * D)
    q_and_k = qkv[:, :(H + KV) * D].view(1, -1, D)
    cos, sin = shapes._rope_tables(1, D)
    gate_up = torch.randn(1, 2 * INTER)
    pairs = {
        "rms_norm": (lambda: lib.rms_norm(x, w, EPS), lambda: torch_ref.rms_norm(x, w, EPS)),
        "add_rms_norm": (lambda: lib.add_rms_norm(x, res, w, EPS),
                         lambda: torch_ref.add_rms_norm(x, res, w, EPS)),
        "rotary (q and k)": (lambda: lib.rotary_embedding(q_and_k, cos, sin),
                             lambda: torch_ref.rotary_embedding(q_and_k, cos, sin)),
        "silu_and_mul": (lambda: lib.silu_and_mul(gate_up),
                         lambda: torch_ref.silu_and_mul(gate_up)),
    }
    for ctx in context_lens:
        pairs[f"paged_attention (KV write + attend), context {ctx}"] = _attention_pair(lib, ctx)
    return pairs


def _attention_pair(lib: DecodeOps, ctx: int) -> tuple[Callable, Callable]:
    num_blocks = ctx // 16 + 2
    meta = shapes._decode_metadata([ctx], 16, num_blocks)
    q, k, v = shapes._step_qkv(1, H, KV, D)
    k_cache, v_cache = shapes._filled_caches(num_blocks, 16, KV, D, torch.float32)

    def torchs():
        meta.decode_workspace = None  # the first layer of each step allocates it
        return torch_ref.paged_attention(q, k, v, k_cache, v_cache, meta, D ** -0.5)

    return (lambda: lib.paged_attention(q, k, v, k_cache, v_cache, meta, D ** -0.5), torchs)


@torch.inference_mode()
def bench_ops(lib: DecodeOps, rounds: int, context_lens: list[int]) -> None:
    print("| op (1 decode row, SmolLM2-135M shapes) | C µs | torch_ref µs | ratio |")
    print("|---|---|---|---|")
    for name, (ours, torchs) in op_pairs(lib, context_lens).items():
        ours(), torchs()
        best_c = best_t = float("inf")
        for _ in range(rounds):
            best_c = min(best_c, _per_call_us(ours))
            best_t = min(best_t, _per_call_us(torchs))
        print(f"| {name} | {best_c:.1f} | {best_t:.1f} | {best_t / best_c:.1f}x |")


def bench_decode(rounds: int, tokens: int, threads: int) -> None:
    from pagoda.engine import LLM, SamplingParams
    from pagoda.kernels.kernel_ops import TORCH_OPS

    engines = {}
    for label, switch in (("C decode ops", "1"), ("PAGODA_NATIVE_KERNELS=0", "0")):
        os.environ["PAGODA_NATIVE_KERNELS"] = switch
        engines[label] = LLM(num_threads=threads)
        ops = engines[label].engine.runner.model.ops
        print(f"{label}: {'torch_ref' if ops is TORCH_OPS else 'C'} ops")
    os.environ.pop("PAGODA_NATIVE_KERNELS")
    params = SamplingParams(temperature=0, max_tokens=tokens, ignore_eos=True)
    chat = [{"role": "user", "content": "Tell me about the history of lighthouses."}]
    best: dict[str, float] = {}
    texts = {}
    for _ in range(rounds):
        for label, llm in engines.items():
            start = time.perf_counter()
            out = llm.chat(chat, params)
            rate = len(out.outputs[0].token_ids) / (time.perf_counter() - start)
            best[label] = max(best.get(label, 0.0), rate)
            texts[label] = out.outputs[0].token_ids
    for label, rate in best.items():
        print(f"{label}: {rate:.1f} tok/s (best of {rounds}, {tokens} tokens, whole chat)")
    print("same greedy tokens:", len(set(map(tuple, texts.values()))) == 1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--chats", type=int, default=3)
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--threads", type=int, default=torch.get_num_threads(),
                        help="torch's threads (1 on a busy machine: a descheduled second "
                             "thread stalls every parallel op for milliseconds)")
    parser.add_argument("--skip-engine", action="store_true")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    print(f"CPU: {cpu_name()}, torch threads {torch.get_num_threads()}")
    bench_ops(DecodeOps.load(kernel_build_dir()), args.rounds, [64, 256, 1024])
    if not args.skip_engine:
        bench_decode(args.chats, args.tokens, args.threads)


if __name__ == "__main__":
    main()
