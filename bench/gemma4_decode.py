"""One-stream greedy decode of a Gemma-4-shaped model, whose decode steps run layer by layer
(the one-call C step does not run its layers: pagoda.engine.models.native_decode.not_covered), beside
a Gemma-3-shaped model of the same widths, once through the one-call C step and once eager.

Random weights at real per-layer widths, fewer layers: hidden 1024, 4 query heads, windowed
layers of two KV heads of 256, and (Gemma 4) global layers of one KV head of 512 whose values are
their keys; five windowed layers to one global, 12 layers, the default model's tokenizer and
vocabulary (49,152), int4 on load. Not a test: results go to docs/ENGINE.md.

    .venv/bin/python bench/gemma4_decode.py [--tokens 128] [--threads 1] [--rounds 3]
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import torch
import transformers
from cpu_info import cpu_name

from pagoda.engine import LLM, SamplingParams
from pagoda.engine.loading.loader import tokenizer_folder
from pagoda.engine.models import decoder

SHAPE = {"hidden_size": 1024, "intermediate_size": 4096, "num_hidden_layers": 12,
         "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 256,
         "sliding_window": 512, "max_position_embeddings": 4096,
         "layer_types": (["sliding_attention"] * 5 + ["full_attention"]) * 2,
         "tie_word_embeddings": True}
GEMMA4 = {"global_head_dim": 512, "num_global_key_value_heads": 1, "attention_k_eq_v": True,
          "hidden_size_per_layer_input": 0}


def save(folder: Path, model_type: str, extra: dict) -> Path:
    tokenizer = transformers.AutoTokenizer.from_pretrained(tokenizer_folder(None))
    config = transformers.AutoConfig.for_model(
        model_type, **SHAPE, **extra, vocab_size=len(tokenizer),
        bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id)
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(config)
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def engine(folder: Path, threads: int, one_call: bool = True) -> LLM:
    build = decoder.NativeDecode.build
    if not one_call:
        decoder.NativeDecode.build = staticmethod(lambda model: None)
    try:
        return LLM(str(folder), quantization="int4", num_threads=threads, num_kv_blocks=64)
    finally:
        decoder.NativeDecode.build = build


def decode_tokens_per_second(llm: LLM, tokens: int) -> float:
    params = SamplingParams(temperature=0, max_tokens=tokens, ignore_eos=True)
    start = time.perf_counter()
    output, = llm.generate([list(range(10, 42))], params)
    elapsed = time.perf_counter() - start
    assert len(output.outputs[0].token_ids) == tokens, output.outputs[0].finish_reason
    return tokens / elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="gemma4-decode-"))
    gemma4 = save(root / "gemma4", "gemma4_text", GEMMA4)
    gemma3 = save(root / "gemma3", "gemma3_text", {"query_pre_attn_scalar": 256})
    engines = {"Gemma 4 shape, eager": engine(gemma4, args.threads),
               "Gemma 3 shape, one C call": engine(gemma3, args.threads),
               "Gemma 3 shape, eager": engine(gemma3, args.threads, one_call=False)}
    best = dict.fromkeys(engines, 0.0)
    for _ in range(args.rounds):  # alternating, the best of each: a shared machine's noise
        for name, llm in engines.items():
            best[name] = max(best[name], decode_tokens_per_second(llm, args.tokens))
    print(f"CPU: {cpu_name()}, {args.threads} threads, {args.tokens} tokens, one stream, "
          f"best of {args.rounds} alternating rounds")
    for name, rate in best.items():
        print(f"{name + ':':28s}{rate:6.1f} tok/s")


if __name__ == "__main__":
    main()
