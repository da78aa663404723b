"""min_tokens through the engine: a reply that would end at once goes on to min_tokens; its end
token, its stop tokens and its stop strings end it only from then on."""

from __future__ import annotations

import pytest

from pagoda.engine import SamplingParams

ENGINE = {"num_kv_blocks": 128, "num_threads": 1}
QUESTION = [{"role": "user", "content": "Reply with just the word OK."}]


@pytest.fixture(scope="module")
def llm(make_llm):
    return make_llm(**ENGINE)


def greedy(llm, **params):
    return llm.chat(QUESTION, SamplingParams(temperature=0, **params)).outputs[0]


def test_a_reply_that_ends_at_once_goes_on_to_min_tokens(llm):
    short = greedy(llm, max_tokens=64)
    assert short.finish_reason == "stop" and len(short.token_ids) < 32  # the model ends it
    least = len(short.token_ids) + 8
    longer = greedy(llm, max_tokens=64, min_tokens=least)
    assert len(longer.token_ids) >= least
    assert not set(longer.token_ids[:least]) & llm.engine.eos_token_ids
    assert longer.text.startswith(short.text)


def test_a_stop_token_ends_the_reply_only_after_min_tokens(llm):
    full = greedy(llm, max_tokens=12, ignore_eos=True).token_ids
    stop_id = full[1]
    assert greedy(llm, max_tokens=12, ignore_eos=True, stop_token_ids=[stop_id]).token_ids \
        == full[:2]
    held = greedy(llm, max_tokens=12, ignore_eos=True, stop_token_ids=[stop_id], min_tokens=6)
    assert len(held.token_ids) >= 6 and stop_id not in held.token_ids[:6]


def test_a_stop_string_written_before_min_tokens_is_text(llm):
    full = greedy(llm, max_tokens=16, ignore_eos=True)
    stop = full.text.split()[0]
    assert greedy(llm, max_tokens=16, ignore_eos=True, stop=[stop]).text == ""
    held = greedy(llm, max_tokens=16, ignore_eos=True, stop=[stop], min_tokens=10)
    assert held.text.startswith(stop) and len(held.token_ids) >= 10


def test_min_tokens_above_max_tokens_is_refused_naming_both():
    with pytest.raises(ValueError, match=r"SamplingParams.min_tokens=9 .*at most max_tokens \(8\)"):
        SamplingParams(min_tokens=9, max_tokens=8)
