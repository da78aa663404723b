"""logit_bias, allowed_token_ids and bad_words steer the reply as a client asks."""

from __future__ import annotations

import pytest

from pagoda.engine.sampling.params import SamplingParams

GREETING = [{"role": "user", "content": "Greet me with one word."}]


@pytest.fixture(scope="module")
def llm(make_llm):
    return make_llm(max_num_seqs=8)


def _first_token(llm, **params) -> int:
    params.setdefault("temperature", 0)
    out = llm.chat(GREETING, SamplingParams(max_tokens=4, **params))
    return out.outputs[0].token_ids[0]


def test_a_minus_100_bias_bans_the_token_greedy_would_pick(llm):
    favourite = _first_token(llm)
    assert _first_token(llm, logit_bias={favourite: -100}) != favourite


def test_a_plus_100_bias_makes_an_unlikely_token_the_pick(llm):
    unlikely = llm.tokenizer.encode(" zebra", add_special_tokens=False)[0]
    assert _first_token(llm, logit_bias={unlikely: 100}) == unlikely


def test_allowed_token_ids_keep_every_token_to_the_list(llm):
    allowed = llm.tokenizer.encode(" yes no maybe", add_special_tokens=False)
    out = llm.chat(GREETING, SamplingParams(temperature=1.0, seed=3, max_tokens=12,
                                            allowed_token_ids=allowed))
    assert set(out.outputs[0].token_ids) <= set(allowed)


def test_bad_words_never_appear_in_the_reply(llm):
    messages = [{"role": "user", "content": "What is the capital of France?"}]
    free = llm.chat(messages, SamplingParams(temperature=0, max_tokens=24)).outputs[0].text
    assert "Paris" in free
    banned = llm.chat(messages, SamplingParams(temperature=0, max_tokens=24,
                                               bad_words=["Paris"])).outputs[0].text
    assert "Paris" not in banned


def test_a_token_id_outside_the_vocabulary_is_refused(make_engine):
    engine = make_engine()
    vocab = engine.runner.vocab_size
    with pytest.raises(ValueError, match=f"logit_bias names token {vocab}, outside"):
        engine.add_request("r", [1, 2], SamplingParams(logit_bias={vocab: 1.0}))
    with pytest.raises(ValueError, match="allowed_token_ids names token"):
        engine.add_request("r", [1, 2], SamplingParams(allowed_token_ids=[1, vocab + 5]))


def test_special_tokens_are_text_only_when_asked_and_the_stop_token_never(llm):
    forced = {1: 100.0}  # <|im_start|> first, then the model's own way to <|im_end|>
    shown = llm.chat(GREETING, SamplingParams(temperature=0, max_tokens=30, logit_bias=forced,
                                              skip_special_tokens=False)).outputs[0]
    hidden = llm.chat(GREETING, SamplingParams(temperature=0, max_tokens=30,
                                               logit_bias=forced)).outputs[0]
    assert shown.text.startswith("<|im_start|>") and not hidden.text.startswith("<|im_start|>")
    ended = llm.chat(GREETING, SamplingParams(temperature=0, max_tokens=30,
                                              skip_special_tokens=False)).outputs[0]
    assert ended.finish_reason == "stop" and ended.token_ids[-1] == 2  # <|im_end|>
    assert "<|im_end|>" not in ended.text
