"""Greedy decoding gives the same tokens as Hugging Face transformers on the same weights.

Our engine runs all prompts together in one batch; the reference is transformers' fp32 forward
pass over each prompt and our reply, one sequence at a time without padding (teacher-forced).
Every token of ours must be the reference's argmax after the tokens before it, which is what
`generate(do_sample=False)` would have chosen there, and a reply that stops without EOS must be
MAX_NEW_TOKENS long. The only difference accepted is a flip where the reference's own two best
logits are within float noise of each other, since there either token is a correct greedy
choice (later tokens are then not compared).
"""

import json
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from tiny_models import TINY_VARIANTS, save_tiny_model

from pagoda.engine import LLM, SamplingParams
from tests.engine.hf_reference import load_hf_model

MAX_NEW_TOKENS = 64
# Two logits this close are a tie as far as fp32 is concerned: different but correct kernels
# may order them either way.
NEAR_TIE = 1e-4
# One thread: the test machine is small and shared, and a matmul thread that waits for a busy
# core slows every step several fold. Both engine and reference run under it.
NUM_THREADS = 1

CHATS = [
    "What is the capital of France? Answer in one sentence.",
    "用三句话介绍一下长城。",
    "Write a Python function that checks whether a string is a palindrome.",
    "Give me three tips for sleeping better.",
]
RAW_TEXTS = [
    "The quick brown fox jumps over the lazy dog. Then the dog",
    "北京是中国的首都，也是一座历史悠久的城市。",
    "def quicksort(items):\n    if len(items) <= 1:\n        return items\n",
    "Once upon a time, in a small village by the sea, there lived",
]


def parity_prompts(tokenizer) -> list[list[int]]:
    """Chat-templated questions (English, Chinese, code) and raw text continuations, as ids."""
    chats = [tokenizer.apply_chat_template([{"role": "user", "content": c}],
                                           add_generation_prompt=True, tokenize=False)
             for c in CHATS]
    return ([tokenizer.encode(c, add_special_tokens=False) for c in chats]
            + [tokenizer.encode(t) for t in RAW_TEXTS])


@torch.inference_mode()
def teacher_forced_logits(model, prompt: list[int], reply: list[int]) -> torch.Tensor:
    """The reference's fp32 logits [len(reply), vocab] behind each token of our reply."""
    if not reply:
        return torch.empty(0)
    input_ids = torch.tensor([prompt + reply[:-1]])
    return model(input_ids).logits[0, len(prompt) - 1:].float()


def assert_matches_reference(ours: list[int], logits: torch.Tensor, eos: frozenset[int],
                             label: str) -> None:
    """Each token the reference's argmax, or diverging first where its top-2 logits nearly tie;
    a reply without EOS is MAX_NEW_TOKENS long, and EOS comes only last."""
    for pos, got in enumerate(ours):
        want = int(logits[pos].argmax())
        if got == want:
            assert got not in eos or pos == len(ours) - 1, f"{label}: went on past EOS at {pos}"
            continue
        top2 = logits[pos].topk(2)
        gap = (top2.values[0] - top2.values[1]).item()
        assert gap <= NEAR_TIE and got in top2.indices.tolist(), (
            f"{label}: token {pos} is {got}, Hugging Face chooses {want} with a top-2 logit gap "
            f"of {gap:.3g} (top-2 ids {top2.indices.tolist()})\nours: {ours}")
        print(f"{label}: near-tie at token {pos} (top-2 gap {gap:.2e}); later tokens not compared")
        return
    assert (ours and ours[-1] in eos) or len(ours) == MAX_NEW_TOKENS, (
        f"{label}: stopped after {len(ours)} tokens without EOS\nours: {ours}")


def assert_greedy_parity(llm: LLM, hf_model, prompts: list[list[int]]) -> None:
    outputs = llm.generate(prompts, SamplingParams(temperature=0, max_tokens=MAX_NEW_TOKENS))
    assert_replies_match_reference(outputs, llm.engine.eos_token_ids, hf_model, prompts)


def assert_replies_match_reference(outputs, eos: frozenset[int], hf_model,
                                   prompts: list[list[int]]) -> None:
    for i, (prompt, out) in enumerate(zip(prompts, outputs, strict=True)):
        ours = out.outputs[0].token_ids
        logits = teacher_forced_logits(hf_model, prompt, ours)
        assert_matches_reference(ours, logits, eos, f"prompt {i} ({len(prompt)} tokens)")
        expected_reason = "stop" if ours and ours[-1] in eos else "length"
        assert out.outputs[0].finish_reason == expected_reason


@pytest.mark.slow
def test_default_model_greedy_matches_transformers_on_a_mixed_batch(
        default_model, hf_default_model, default_model_greedy_replies):
    outputs, eos = default_model_greedy_replies
    assert_replies_match_reference(outputs, eos, hf_default_model,
                                   parity_prompts(default_model.tokenizer))


def save_tiny_variant(tmp_path_factory, tokenizer_dir: Path, variant: str) -> Path:
    """One of TINY_VARIANTS, or e.g. "mistral-window24" (keys beyond 24 tokens back masked), or
    "qwen3-window24-first" (only the first layer windowed, the other global)."""
    base, _, window = variant.partition("-window")
    window = window.removesuffix("-first")
    folder = save_tiny_model(tmp_path_factory.mktemp(variant), base, tokenizer_dir)
    if window:
        config = json.loads((folder / "config.json").read_text())
        config["sliding_window"] = int(window)
        if "layer_types" in config:  # Qwen windows only the layers it lists as sliding
            config["use_sliding_window"] = True
            layers = config["num_hidden_layers"]
            config["layer_types"] = (["sliding_attention"] + ["full_attention"] * (layers - 1)
                                     if variant.endswith("-first")
                                     else ["sliding_attention"] * layers)
        (folder / "config.json").write_text(json.dumps(config))
    return folder


@pytest.fixture(scope="module")
def tiny_variant(tmp_path_factory, default_model) -> Callable[[str], Path]:
    """tiny_variant("mistral-window24"): that variant's folder, saved once for the module."""
    folders: dict[str, Path] = {}

    def saved(variant: str) -> Path:
        if variant not in folders:
            folders[variant] = save_tiny_variant(tmp_path_factory, default_model.path, variant)
        return folders[variant]

    return saved


@pytest.fixture(params=[*TINY_VARIANTS, "mistral-window24", "qwen3-window24",
                        "qwen3-window24-first"])
def tiny_model_dir(request, tiny_variant) -> Path:
    return tiny_variant(request.param)


def test_tiny_random_model_greedy_matches_transformers(tiny_model_dir, default_model):
    llm = LLM(str(tiny_model_dir), num_kv_blocks=128, num_threads=NUM_THREADS)
    prompts = parity_prompts(default_model.tokenizer)
    assert_greedy_parity(llm, load_hf_model(tiny_model_dir), prompts)


@pytest.mark.parametrize("variant", ["mistral-window24", "qwen3-window24-first"])
def test_sliding_window_holds_across_prefill_chunks(variant, tiny_variant, default_model):
    folder = tiny_variant(variant)
    # 16-token chunks: later chunks of the ~45-token chat prompts attend through the window mask.
    llm = LLM(str(folder), num_kv_blocks=128, num_threads=NUM_THREADS, max_num_batched_tokens=16)
    prompts = parity_prompts(default_model.tokenizer)
    assert_greedy_parity(llm, load_hf_model(folder), prompts)


# About 300 tokens: positions far past the llama3-rope variant's original 64-token context.
LONG_TEXT = (
    "The history of the lighthouse begins with fires lit on hilltops to guide ships at night. "
    "The Pharos of Alexandria, finished around 280 BC, stood more than a hundred metres tall and "
    "was counted among the seven wonders of the ancient world. Roman engineers built towers from "
    "Dover to Spain, and medieval monks kept lamps burning on rocky islands. In 1698 Henry "
    "Winstanley raised a wooden tower on the Eddystone rocks; a storm swept it away five years "
    "later, with its builder inside. John Smeaton's granite tower of 1759 lasted over a century, "
    "and its dovetailed stones became the pattern for every rock lighthouse that followed. "
    "Fresnel's lenses, first lit in 1823, bent the light of a single lamp into a beam visible "
    "for twenty miles, and keepers wound clockwork every few hours through the night so that "
    "the lens kept turning. 灯塔的历史也在中国的海岸上展开，从宁波到厦门，守塔人世代相传。 "
    "Today most lights are automatic, watched from afar, and the keepers' cottages have become "
    "museums, holiday homes and bird observatories, while the towers themselves still"
)


def test_llama3_rope_scaling_matches_transformers_far_past_the_original_context(
        tiny_variant, default_model):
    folder = tiny_variant("llama3-rope")
    llm = LLM(str(folder), num_kv_blocks=128, num_threads=NUM_THREADS)
    prompt = default_model.tokenizer.encode(LONG_TEXT)
    assert len(prompt) > 4 * 64
    assert_greedy_parity(llm, load_hf_model(folder), [prompt])
