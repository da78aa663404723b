"""EngineConfig.dtype on a CPU: the trained default model computing in bf16 against fp32 (issue 31).

Every weight is dequantized (quantization "none"), so the weights, activations, norms,
attention and KV cache are the only things that change; the quantized kernels are judged
against this same fp32 model in tests/engine/quantization/test_quantization.py.

bf16 moves this model's logits by a few tenths: teacher-forced over the quality text it
predicted 97.1% of next tokens as fp32 does, where transformers' own bf16 model agrees with
its fp32 one on 97.0% (the issue's 99% is out of reach of bf16 activations here: the weights
rounded to bf16 alone, computed in fp32, still agree on 99.7%). So the specification is that
bf16 parts from fp32 only where fp32 itself nearly ties, and rarely.
"""

from __future__ import annotations

import pytest
import torch

from pagoda.engine import LLM, SamplingParams
from pagoda.engine.config import EngineConfig
from pagoda.engine.loading.loader import LoadedModel
from pagoda.engine.outputs import CompletionOutput
from pagoda.engine.worker.evaluation import compare, prompt_logits
from pagoda.engine.worker.model_runner import ModelRunner
from tests.engine.models.test_parity import MAX_NEW_TOKENS, parity_prompts

# One thread, as the parity tests: a matmul thread that waits for a busy core slows every step.
GREEDY_ENGINE = {"num_kv_blocks": 128, "num_threads": 1}
# A top-2 logit gap under this is within bf16's reach: the largest gap where bf16 predicted
# another next token than fp32, over the quality text, was 0.27.
BF16_NEAR_TIE = 0.5
# The quality reference's first three prefill chunks (its English): half the bf16 prefill of the
# whole head, and ~500 positions with a top-2 gap over BF16_NEAR_TIE still bind the claim.
BF16_TOKENS = 768


def runner_in(loaded: LoadedModel, dtype: torch.dtype) -> ModelRunner:
    """A runner over the dequantized model that computes in dtype, with room for the quality
    text's ~2,500 tokens."""
    runner = ModelRunner(loaded, EngineConfig(num_kv_blocks=200, dtype=dtype))
    assert runner.model.layers[0].qkv_proj.method.weight.dtype == dtype
    assert runner.kv_caches[0][0].dtype == dtype
    return runner


def gaps_where_predictions_part(reference: torch.Tensor, logits: torch.Tensor) -> torch.Tensor:
    """The reference's top-2 logit gap at each row where the two predict different tokens."""
    top2 = reference.topk(2, dim=-1).values
    return (top2[:, 0] - top2[:, 1])[reference.argmax(-1) != logits.argmax(-1)]


def greedy_outputs(llm: LLM, prompts: list[list[int]]) -> list[CompletionOutput]:
    """The parity tests' greedy decoding of every prompt, in one batch."""
    params = SamplingParams(temperature=0, max_tokens=MAX_NEW_TOKENS)
    return [out.outputs[0] for out in llm.generate(prompts, params)]


def first_difference(a: list[int], b: list[int]) -> int | None:
    """The first position where the token lists differ (a shorter one ends there), or None."""
    for pos, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return pos
    return None if len(a) == len(b) else min(len(a), len(b))


@pytest.mark.slow
def test_bf16_predicts_the_next_token_as_fp32_does_but_at_near_ties(default_model,
                                                                     quality_reference_head):
    """Teacher-forced over the quality text's first BF16_TOKENS tokens: a bf16 prefill on a CPU
    without AVX512-BF16 takes ~30 ms a token, so the whole text's 2,561 were ~85 s of the suite
    and the reference's 1,536 ~54 s; 506 of these 767 predictions have a top-2 gap over
    BF16_NEAR_TIE, each one bf16 must share. The fp32 logits of a prefix are the reference's
    own rows: a causal prefill in the same 256-token chunks computes them alike."""
    token_ids, fp32 = quality_reference_head
    token_ids, fp32 = token_ids[:BF16_TOKENS], fp32[:BF16_TOKENS]
    bf16 = prompt_logits(runner_in(default_model, torch.bfloat16), token_ids)
    report = compare(fp32, bf16, token_ids)
    # Measured over these tokens: 97.7% and 1.0001 without AVX512-BF16 (oneDNN held to
    # AVX512_CORE_VNNI; the same 97.7% over the 1,536), 97.4% and 1.0014 with it (97.7% and
    # 1.0010 over the 1,536); the largest gap where the two parted was 0.17 (0.27 over the whole).
    assert report.top1_agreement >= 0.96
    assert abs(report.perplexity_ratio - 1) < 0.005
    assert gaps_where_predictions_part(fp32[:-1], bf16[:-1]).max() < BF16_NEAR_TIE


@pytest.mark.slow
def test_bf16_greedy_replies_part_from_fp32_s_only_at_near_ties(default_model, make_llm,
                                                               default_model_greedy_replies):
    """The parity tests' 8 prompts, 64 tokens each: a reply follows the first near tie that
    rounding tips the other way (measured: 4 of 8 replies identical, the others parting at
    reply tokens 3, 28, 33 and 51). fp32's replies are the parity test's own."""
    prompts = parity_prompts(default_model.tokenizer)
    want = [out.outputs[0] for out in default_model_greedy_replies[0]]
    got = greedy_outputs(make_llm(**GREEDY_ENGINE, dtype=torch.bfloat16), prompts)
    for i, (g, w) in enumerate(zip(got, want, strict=True)):
        pos = first_difference(g.token_ids, w.token_ids)
        if pos is None:
            continue
        top = w.logprobs[pos].top  # the stop token ends a reply: both hold a token at pos
        gap = top[0].logprob - top[1].logprob
        assert gap < BF16_NEAR_TIE, (f"prompt {i}: bf16 chose {g.token_ids[pos]} at reply token "
                                     f"{pos}, fp32 {w.token_ids[pos]} by a logit gap of {gap:.3f}")
