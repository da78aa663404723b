"""One-stream decode with and without the one-call C decode step, on one model, in one process.

Not a test: `python bench/native_decode_layers.py [model]` (default: the real Gemma 3 270M
Q4_K_M of the test extra) prints, for one engine with its `model.native_decode` on and off,
rounds alternating between the two, best round of each: the layer stack's time in one decode
step (`hidden_states`, one row at 100 tokens of context), and greedy decode tok/s through
`LLM.generate`, with whether both gave the same tokens.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch
from cpu_info import cpu_name

sys.path.insert(0, str(Path(__file__).parents[1]))


def _default_model() -> str:
    from tests.engine.real_gemma3 import gemma3_270m_file

    return str(gemma3_270m_file())


@torch.inference_mode()
def layer_stack_ms(llm, native, rounds: int) -> dict[str, float]:
    """Best time of `hidden_states` for one decode row, with and without the one call."""
    from pagoda.engine import SamplingParams

    engine, model = llm.engine, llm.engine.runner.model
    engine.add_request("probe", list(range(1000, 1100)), SamplingParams(max_tokens=8))
    engine.step()  # the prefill
    inputs = engine.runner.prepare_inputs(engine.scheduler.schedule().scheduled)
    best: dict[str, float] = {}
    for _ in range(rounds):
        for label, step in (("one C call", native), ("layer by layer", None)):
            model.native_decode = step
            for _ in range(10):
                start = time.perf_counter()
                model.hidden_states(inputs.input_ids, inputs.positions, inputs.attn,
                                    engine.runner.kv_caches)
                best[label] = min(best.get(label, 1e9), (time.perf_counter() - start) * 1e3)
    model.native_decode = native
    engine.abort_request("probe")
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model", nargs="?", help="a GGUF file or folder (default: Gemma 3 270M)")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    args = parser.parse_args()
    from pagoda.engine import LLM, SamplingParams

    llm = LLM(args.model or _default_model(), num_threads=args.threads)
    model = llm.engine.runner.model
    native = model.native_decode
    if native is None:
        sys.exit(f"{args.model}: the one-call C decode step does not run this model here")
    print(f"CPU: {cpu_name()}, torch threads {args.threads}, {model.arch.family}")
    for label, ms in layer_stack_ms(llm, native, args.rounds).items():
        print(f"{label}: layer stack {ms:.2f} ms a decode step (best of {args.rounds} x 10)")
    params = SamplingParams(temperature=0, max_tokens=args.tokens, ignore_eos=True)
    prompt = ["The history of the lighthouse begins with"]
    best: dict[str, float] = {}
    tokens: dict[str, tuple[int, ...]] = {}
    for _ in range(args.rounds):
        for label, step in (("one C call", native), ("layer by layer", None)):
            model.native_decode = step
            start = time.perf_counter()
            out = llm.generate(prompt, params)[0].outputs[0]
            rate = len(out.token_ids) / (time.perf_counter() - start)
            best[label] = max(best.get(label, 0.0), rate)
            tokens[label] = tuple(out.token_ids)
    for label, rate in best.items():
        print(f"{label}: {rate:.1f} tok/s (best of {args.rounds}, {args.tokens} tokens)")
    print("same greedy tokens:", len(set(tokens.values())) == 1)


if __name__ == "__main__":
    main()
