"""What a JSON-schema constraint costs decoding: every row constrained against none, side by
side in one process (rounds alternated), at one stream and at 32; and what compiling a
typical schema costs, cold and cached.

Not a test: `python bench/structured_output.py` on a quiet machine; copy the table into
docs/BENCHMARKS.md. The default model (the bundled GGUF, quantized path) unless --model.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

from cpu_info import cpu_name

from pagoda.engine import LLM, SamplingParams
from pagoda.engine.sampling.params import StructuredOutputsParams

# A list long enough that a reply under it runs about as long as the free one.
LONG_REPLY = {"type": "object", "properties": {
    "facts": {"type": "array", "items": {"type": "string", "maxLength": 60},
              "minItems": 12, "maxItems": 12}}, "required": ["facts"]}
# A schema of the size clients send for extraction: 15 properties of assorted kinds.
TYPICAL = {"type": "object", "properties": {
    "name": {"type": "string"}, "age": {"type": "integer", "minimum": 0, "maximum": 150},
    "email": {"type": "string", "format": "email"}, "phone": {"type": "string",
                                                             "pattern": "^[0-9-]{7,15}$"},
    "city": {"type": "string"}, "country": {"enum": ["FR", "DE", "US", "JP", "BR"]},
    "married": {"type": "boolean"}, "children": {"type": "integer", "minimum": 0},
    "height_m": {"type": "number"}, "tags": {"type": "array", "items": {"type": "string"},
                                               "maxItems": 5},
    "employer": {"type": "object", "properties": {"name": {"type": "string"},
                                                  "since": {"type": "integer"}}},
    "languages": {"type": "array", "items": {"enum": ["en", "fr", "de"]}},
    "notes": {"type": ["string", "null"]}, "score": {"type": "number", "minimum": 0},
    "joined": {"type": "string", "format": "date"}},
    "required": ["name", "age", "email", "city", "country"]}

ASK = "Give twelve short facts about {}, as JSON."
TOPICS = ["the ocean", "honeybees", "volcanoes", "the moon", "chess", "bread", "comets", "Rome"]


def run(llm: LLM, streams: int, constrained: bool, max_tokens: int, seed: int) -> float:
    """Output tokens per second over `streams` chats decoded together."""
    messages = [[{"role": "user", "content": ASK.format(TOPICS[i % len(TOPICS)])}]
                for i in range(streams)]
    if constrained:
        params = [SamplingParams(temperature=0.8, seed=seed + i, max_tokens=max_tokens,
                                 structured_outputs=StructuredOutputsParams(json=LONG_REPLY))
                  for i in range(streams)]
    else:
        params = [SamplingParams(temperature=0.8, seed=seed + i, max_tokens=max_tokens,
                                 ignore_eos=True) for i in range(streams)]
    began = time.perf_counter()
    outs = llm.chat(messages, params)
    seconds = time.perf_counter() - began
    return sum(len(o.outputs[0].token_ids) for o in outs) / seconds


def compile_times(llm: LLM) -> tuple[float, float]:
    compiler = llm.engine.grammar_compiler
    constraint = StructuredOutputsParams(json=json.dumps(TYPICAL))
    began = time.perf_counter()
    compiler.compile(constraint)
    cold = time.perf_counter() - began
    began = time.perf_counter()
    compiler.compile(StructuredOutputsParams(json=json.dumps(TYPICAL)))
    return cold, time.perf_counter() - began


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=None)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--max-tokens", type=int, default=160)
    args = parser.parse_args()
    llm = LLM(args.model, max_num_seqs=32)
    _ = llm.engine.vocabulary.info  # the tokenizer's tables, built once, outside the timings
    cold, cached = compile_times(llm)
    print(f"CPU: {cpu_name()}")
    print(f"compile a 15-property schema: {cold * 1000:.1f} ms cold, {cached * 1e6:.0f} us "
          "cached")
    print("| streams | free tok/s | JSON-schema tok/s | ratio |")
    print("|---|---|---|---|")
    for streams in (1, 32):
        run(llm, streams, True, 16, 0)  # warm both paths
        free, constrained = [], []
        for r in range(args.rounds):
            free.append(run(llm, streams, False, args.max_tokens, 100 * r))
            constrained.append(run(llm, streams, True, args.max_tokens, 100 * r))
        f, c = statistics.median(free), statistics.median(constrained)
        print(f"| {streams} | {f:.1f} | {c:.1f} | {c / f:.2f}x |")


if __name__ == "__main__":
    main()
