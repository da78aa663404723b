"""Prompt lookup: what the n-gram proposer drafts, and how often it expects drafts to be kept."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pagoda.engine.config import EngineConfig
from pagoda.engine.core.sequence import Sequence
from pagoda.engine.sampling.params import SamplingParams
from pagoda.engine.spec_decode.ngram_proposer import DEFAULT_ACCEPTANCE, NgramProposer


def seq(tokens: list[int]) -> Sequence:
    return Sequence("r", list(tokens), SamplingParams(max_tokens=100), frozenset())


def brute_force(tokens: list[int], k: int, ngram_min: int, ngram_max: int) -> list[int]:
    """The specification: the tokens after the latest earlier occurrence of the longest tail."""
    for n in range(min(ngram_max, len(tokens) - 1), ngram_min - 1, -1):
        tail = tokens[-n:]
        for start in range(len(tokens) - n - 1, -1, -1):
            if tokens[start:start + n] == tail:
                drafts = []
                for pos in range(start + n, start + n + k):
                    drafts.append(tokens[pos] if pos < len(tokens) else drafts[pos - len(tokens)])
                return drafts
    return []


def test_drafts_the_tokens_after_the_latest_match_of_the_tail():
    proposer = NgramProposer(3, 1, 4)
    s = seq([1, 2, 3, 4, 5, 9, 9, 1, 2, 3, 7, 8, 6, 1, 2, 3])
    assert proposer.propose(s, 10) == [7, 8, 6]


def test_a_longer_matching_ngram_wins_over_a_more_recent_shorter_one():
    proposer = NgramProposer(2, 1, 3)
    s = seq([5, 6, 7, 40, 41, 9, 7, 50, 51, 5, 6, 7])
    assert proposer.propose(s, 10) == [40, 41]


def test_no_match_drafts_nothing():
    assert NgramProposer(4, 2, 4).propose(seq([1, 2, 3, 4, 5, 6]), 10) == []


def test_drafts_never_exceed_the_callers_limit():
    proposer = NgramProposer(4, 1, 4)
    s = seq([1, 2, 3, 4, 5, 6, 7, 1, 2])
    assert proposer.propose(s, 2) == [3, 4]
    assert proposer.propose(s, 0) == []


def test_a_loop_is_continued_past_the_end_of_the_context():
    proposer = NgramProposer(5, 1, 2)
    assert proposer.propose(seq([8, 1, 2, 1, 2]), 10) == [1, 2, 1, 2, 1]


def test_the_index_follows_tokens_appended_later():
    proposer = NgramProposer(2, 2, 2)
    s = seq([1, 2, 3, 4])
    assert proposer.propose(s, 10) == []
    for token in (9, 1, 2):
        s.append_token(token)
    assert proposer.propose(s, 10) == [3, 4]


@settings(max_examples=200, deadline=None)
@given(prompt=st.lists(st.integers(0, 4), min_size=1, max_size=40),
       appended=st.lists(st.lists(st.integers(0, 4), max_size=5), max_size=8),
       ngram_min=st.integers(1, 3), extra=st.integers(0, 2), k=st.integers(1, 5))
def test_incremental_index_matches_a_brute_force_search(prompt, appended, ngram_min, extra, k):
    proposer = NgramProposer(k, ngram_min, ngram_min + extra)
    s = seq(prompt)
    for new_tokens in [[], *appended]:
        for token in new_tokens:
            s.append_token(token)
        want = brute_force(s.all_token_ids, k, ngram_min, ngram_min + extra)
        assert proposer.propose(s, k) == want


def test_acceptance_starts_from_the_overall_rate_and_follows_the_recent_trials():
    proposer = NgramProposer(4, 1, 4)
    s, other = seq([1, 2, 1]), seq([5, 6, 5])
    proposer.propose(s, 4)
    proposer.propose(other, 4)
    assert proposer.acceptance(s) == DEFAULT_ACCEPTANCE

    for _ in range(20):
        proposer.record(s, 2, 2)  # both kept: 2 tried, 2 kept
    assert proposer.acceptance(s) > 0.9
    assert proposer.acceptance(other) > DEFAULT_ACCEPTANCE  # the overall rate rose with it
    for _ in range(40):
        proposer.record(s, 3, 0)  # the first rejected: 1 tried
    assert proposer.acceptance(s) < 0.2


def test_a_shadow_check_counts_as_one_draft_tried_without_touching_the_metrics():
    proposer = NgramProposer(2, 1, 4)
    s = seq([1, 2, 1])
    proposer.propose(s, 2)
    for _ in range(30):
        proposer.record_shadow(s, kept=False)
    low = proposer.acceptance(s)
    for _ in range(30):
        proposer.record_shadow(s, kept=True)

    assert low < 0.1 and proposer.acceptance(s) > 0.8
    assert proposer.acceptance_rate is None and s.metrics.num_draft_tokens == 0


def test_counts_feed_the_request_metrics_and_the_overall_rate():
    proposer = NgramProposer(4, 1, 4)
    s = seq([1, 2, 1])
    assert proposer.acceptance_rate is None
    proposer.record(s, 4, 3)
    proposer.record(s, 2, 0)
    assert (proposer.num_draft_tokens, proposer.num_accepted_tokens) == (6, 3)
    assert proposer.acceptance_rate == 0.5
    assert (s.metrics.num_draft_tokens, s.metrics.num_accepted_tokens) == (6, 3)
    assert s.metrics.spec_acceptance_rate == 0.5


@pytest.mark.parametrize("config", [{"num_speculative_tokens": -1},
                                    {"ngram_min": 0}, {"ngram_min": 3, "ngram_max": 2}])
def test_bad_speculation_settings_name_the_field(config):
    with pytest.raises(ValueError, match=next(iter(config))):
        EngineConfig(**config)


def test_no_batch_size_limit_unless_one_is_set():
    assert EngineConfig().speculative_disable_by_batch_size is None
    assert EngineConfig(device="cuda").speculative_disable_by_batch_size is None
    assert EngineConfig(speculative_disable_by_batch_size=16).speculative_disable_by_batch_size == 16
