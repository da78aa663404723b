"""Logprobs are the model's own log-softmax, reported for every sampled token."""

from __future__ import annotations

import math

import pytest
import torch

from pagoda.engine.sampling.params import SamplingParams


@pytest.fixture(scope="module")
def llm(make_llm):
    return make_llm(max_num_seqs=8)


@pytest.mark.slow
def test_logprobs_equal_transformers_log_softmax(llm, hf_default_model):
    prompt = llm.tokenizer.encode("The three primary colours are")
    out = llm.generate(prompt, SamplingParams(temperature=0, max_tokens=6, logprobs=5))[0]
    completion = out.outputs[0]
    tokens = prompt + completion.token_ids
    with torch.inference_mode():
        reference = hf_default_model(torch.tensor([tokens])).logits[0].float().log_softmax(-1)
    for i, entry in enumerate(completion.logprobs):
        row = reference[len(prompt) - 1 + i]
        assert entry.chosen.token_id == completion.token_ids[i]
        assert entry.chosen.logprob == pytest.approx(float(row[entry.chosen.token_id]), abs=1e-3)
        best = row.topk(5)
        assert [t.token_id for t in entry.top] == best.indices.tolist()
        assert [t.logprob for t in entry.top] == pytest.approx(best.values.tolist(), abs=1e-3)


def test_each_token_has_its_logprob_rank_and_text(llm):
    out = llm.generate(llm.tokenizer.encode("Once upon a time"),
                       SamplingParams(temperature=1.0, seed=11, max_tokens=8, logprobs=3))[0]
    completion = out.outputs[0]
    assert [e.chosen.token_id for e in completion.logprobs] == completion.token_ids
    for entry in completion.logprobs:
        assert entry.chosen.logprob <= 0 and len(entry.top) == 3
        if entry.rank <= 3:
            assert entry.top[entry.rank - 1].token_id == entry.chosen.token_id
        else:
            assert entry.chosen.token_id not in [t.token_id for t in entry.top]
        text = llm.tokenizer.decode([entry.chosen.token_id])
        assert entry.chosen.token_bytes.decode("utf-8", errors="replace") == text
    assert "".join(e.chosen.token for e in completion.logprobs) == completion.text


def test_streamed_logprob_deltas_add_up_to_the_whole(make_engine):
    engine = make_engine()
    engine.add_request("r", engine.tokenizer.encode("Hello there"),
                       SamplingParams(temperature=0, max_tokens=6, logprobs=0))
    deltas, final = [], None
    while engine.has_unfinished_requests():
        for out in engine.step():
            deltas += out.outputs[0].delta_logprobs or []
            final = out.outputs[0]
    assert final.logprobs == deltas and len(deltas) == len(final.token_ids) == 6
    assert all(e.top == () and math.isfinite(e.chosen.logprob) for e in deltas)


def test_requests_without_logprobs_get_none(llm):
    out = llm.generate(llm.tokenizer.encode("Hi"), SamplingParams(max_tokens=2))[0]
    assert out.outputs[0].logprobs is None


@pytest.mark.slow
def test_prompt_logprobs_equal_transformers_log_softmax_across_prefill_chunks(
        make_llm, hf_default_model):
    llm = make_llm(max_num_batched_tokens=16)  # a 40-token prompt read in three chunks
    prompt = llm.tokenizer.encode("The quick brown fox jumps over the lazy dog, and then " * 4)
    out = llm.generate(prompt, SamplingParams(temperature=0, max_tokens=1, prompt_logprobs=2))[0]
    with torch.inference_mode():
        reference = hf_default_model(torch.tensor([prompt])).logits[0].float().log_softmax(-1)
    assert out.prompt_logprobs[0] is None and len(out.prompt_logprobs) == len(prompt)
    for position, entry in enumerate(out.prompt_logprobs[1:], 1):
        row = reference[position - 1]
        assert entry.chosen.token_id == prompt[position]
        assert entry.chosen.logprob == pytest.approx(float(row[prompt[position]]), abs=1e-3)
        assert [t.token_id for t in entry.top] == row.topk(2).indices.tolist()


def test_prompt_logprobs_read_the_whole_prompt_past_the_prefix_cache(make_llm):
    llm = make_llm()
    prompt = llm.tokenizer.encode("A prompt long enough to fill a few cache blocks. " * 6)
    asked = SamplingParams(temperature=0, max_tokens=2, prompt_logprobs=0)
    first = llm.generate(prompt, SamplingParams(temperature=0, max_tokens=2))[0]
    again = llm.generate(prompt, asked)[0]
    assert first.num_cached_tokens == 0 and again.num_cached_tokens == 0
    assert all(e is not None for e in again.prompt_logprobs[1:])
    assert again.outputs[0].token_ids == first.outputs[0].token_ids
    cached = llm.generate(prompt, SamplingParams(temperature=0, max_tokens=2))[0]
    assert cached.num_cached_tokens > 0 and cached.prompt_logprobs is None
