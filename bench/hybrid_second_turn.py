"""A hybrid model's second chat turn with the prefix cache (recurrent state checkpoints) and
without: time to its first token, alternating, and the first turn's, on a random model of
LFM2-350M's shape or the file --model names (bench/qwen35_file.py's, say).

    PYTHONPATH=. python bench/hybrid_second_turn.py [--threads 2] [--rounds 4] [--model FILE]
        [--prompt-tokens 1500] [--restart]

Each round is a new chat (its first token differs): a 1501-token prompt, a 32-token reply, then
the second turn (prompt + reply + a 50-token message) asks for one token.

--restart: the second turn after a restart instead of without the prefix cache. The engine keeps
its cache on disk too; after each round's first turn and its second turn (warm: checkpoints in
memory) it is closed, and a new engine over the same folder answers the second turn with
another message, from the blocks and checkpoint on disk (just written: the system's page cache
likely holds them), then plays the next round. Each new engine first answers a prompt of its
own (WARM_UP_TOKENS), so the time is the cache's, not that of an engine's first long step.
"""

from __future__ import annotations

import argparse
import gc
import statistics
import tempfile
import time
from pathlib import Path

import torch
import transformers
from cpu_info import cpu_name

from pagoda.engine import LLM, SamplingParams
from tests.engine.tiny_models import save_tiny_model

# LFM2-350M: 16 layers, the attention ones at 2, 5, 8, 10, 12 and 14.
LAYER_TYPES = ["full_attention" if i in (2, 5, 8, 10, 12, 14) else "conv" for i in range(16)]
REPLY = SamplingParams(temperature=0, max_tokens=32, ignore_eos=True)
FIRST_TOKEN = SamplingParams(temperature=0, max_tokens=1, ignore_eos=True)
WARM_UP_TOKENS = 256


def save_model(root: Path) -> tuple[Path, list[int]]:
    """The model folder and a run of token ids to make prompts of."""
    tiny = save_tiny_model(root / "tiny", "lfm2")
    tokenizer = transformers.AutoTokenizer.from_pretrained(tiny)
    config = transformers.AutoConfig.from_pretrained(tiny)
    config.update({"hidden_size": 1024, "num_hidden_layers": 16, "num_attention_heads": 16,
                   "num_key_value_heads": 8, "intermediate_size": 6656,
                   "layer_types": LAYER_TYPES, "max_position_embeddings": 4096,
                   "initializer_range": 0.02})
    torch.manual_seed(0)
    folder = root / "lfm2-350m-shape"
    transformers.Lfm2ForCausalLM(config).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    text = " ".join(f"Sentence {i} says something about the weather and the sea."
                    for i in range(400))
    return folder, tokenizer.encode(text)


def second_turn_seconds(llm: LLM, prompt: list[int],
                        message: list[int]) -> tuple[float, float, int]:
    """The first turn's time to its first token (a prompt not seen before), then the second
    turn's, and how many of the second turn's prompt tokens came from the cache."""
    began = time.perf_counter()
    llm.generate([prompt], FIRST_TOKEN)
    first = time.perf_counter() - began
    reply = llm.generate([prompt], REPLY)[0].outputs[0].token_ids
    began = time.perf_counter()
    out = llm.generate([prompt + list(reply) + message], FIRST_TOKEN)[0]
    return first, time.perf_counter() - began, out.num_cached_tokens


def timed(llm: LLM, prompt: list[int]) -> tuple[float, int]:
    """Time to the first token of `prompt`, and how many of its tokens were cached."""
    began = time.perf_counter()
    out = llm.generate([prompt], FIRST_TOKEN)[0]
    return time.perf_counter() - began, out.num_cached_tokens


def restart_rounds(folder: Path, ids: list[int] | None, args: argparse.Namespace,
                   disk: Path) -> None:
    n = args.prompt_tokens

    def open_engine(number: int) -> LLM:
        llm = LLM(str(folder), num_threads=args.threads, max_model_len=4096,
                  disk_cache_dir=disk)
        # A new engine's first long step pays for what is made once (buffers, kernels' first
        # calls on such shapes): a prompt of its own first (its first token tells it from the
        # other engines'), so the turns time the cache, not the start.
        llm.generate([[number] + list(range(1000, 1000 + WARM_UP_TOKENS))], FIRST_TOKEN)
        return llm

    llm = open_engine(0)
    ids = ids or file_prompt_ids(llm, n + 100)
    times: dict[str, list[float]] = {"first turn": [], "second turn, warm": [],
                                     "second turn after a restart": []}
    for r in range(args.rounds):
        prompt = [r + 3] + ids[:n]
        first, _ = timed(llm, prompt)
        turn = prompt + list(llm.generate([prompt], REPLY)[0].outputs[0].token_ids)
        warm, warm_cached = timed(llm, turn + ids[n:n + 50])
        llm.engine.close()
        del llm
        gc.collect()
        llm = open_engine(r + 1)
        restarted, restart_cached = timed(llm, turn + ids[n + 50:n + 100])
        for name, took in zip(times, (first, warm, restarted), strict=True):
            times[name].append(took)
        print(f"round {r}: first turn {first * 1000:.0f} ms, second warm {warm * 1000:.0f} ms "
              f"({warm_cached} cached), after a restart {restarted * 1000:.0f} ms "
              f"({restart_cached} cached)", flush=True)
    llm.engine.close()
    print(f"{cpu_name()}; {folder.name if args.model else 'LFM2-350M shape'}; {n}-token prompt")
    for name, took in times.items():
        print(f"{name}: mean {statistics.mean(took) * 1000:.0f} ms, "
              f"median {statistics.median(took) * 1000:.0f} ms")


def file_prompt_ids(llm: LLM, length: int) -> list[int]:
    """Token ids of a long text by the model's own tokenizer."""
    text = " ".join(f"Sentence {i} says something about the weather and the sea."
                    for i in range(length // 8))
    return llm.engine.tokenizer.encode(text)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--model", type=Path,
                        help="a model file or folder (default: random LFM2-350M-shaped weights)")
    parser.add_argument("--prompt-tokens", type=int, default=1500)
    parser.add_argument("--restart", action="store_true",
                        help="time the second turn after a restart (disk cache) instead of "
                             "with the prefix cache off")
    args = parser.parse_args()
    n = args.prompt_tokens
    with tempfile.TemporaryDirectory() as tmp:
        folder, ids = (args.model, None) if args.model else save_model(Path(tmp))
        if args.restart:
            restart_rounds(folder, ids, args, Path(tmp) / "disk")
            return
        engines = {on: LLM(str(folder), num_threads=args.threads, enable_prefix_caching=on,
                           max_model_len=4096) for on in (True, False)}
        ids = ids or file_prompt_ids(engines[True], n + 50)
        seconds: dict[bool, list[float]] = {True: [], False: []}
        firsts: list[float] = []
        for r in range(args.rounds):
            for on in (True, False) if r % 2 == 0 else (False, True):
                first, took, cached = second_turn_seconds(engines[on], [r + 3] + ids[:n],
                                                          ids[n:n + 50])
                seconds[on].append(took)
                if on:
                    firsts.append(first)
                print(f"round {r} prefix cache {'on ' if on else 'off'}: first turn "
                      f"{first * 1000:.0f} ms, second {took * 1000:.0f} ms ({cached} tokens "
                      "cached)", flush=True)
    print(f"{cpu_name()}; {folder.name if args.model else 'LFM2-350M shape'}; {n}-token prompt")
    print(f"first turn (prefix cache on): median {statistics.median(firsts) * 1000:.0f} ms")
    for on in (True, False):
        mean, median = statistics.mean(seconds[on]), statistics.median(seconds[on])
        print(f"prefix cache {'on ' if on else 'off'}: mean {mean * 1000:.0f} ms, "
              f"median {median * 1000:.0f} ms")


if __name__ == "__main__":
    main()
