"""Prompt lookup: the tokens that followed the latest earlier occurrence of the context's tail.

No second model: each sequence keeps an index from every n-gram of its tokens (n in
[ngram_min, ngram_max]) to where that n-gram last occurred, updated with the new tokens only, so a
proposal costs a few dictionary lookups however long the context is.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

from pagoda.engine.outputs import RequestMetrics

# Each sequence's acceptance (drafts kept over drafts tried) weighs recent trials most: every
# verification or shadow check keeps this fraction of the weight of those before it...
ACCEPTANCE_DECAY = 0.9
# ...and starts from the engine's overall rate as if this many drafts had been tried with it.
PRIOR_TRIALS = 2.0
# The overall rate before any draft was tried, and how slowly it moves.
DEFAULT_ACCEPTANCE = 0.5
OVERALL_DECAY = 0.99


class DraftedSequence(Protocol):
    """What the proposer reads of a sequence (core.sequence.Sequence, in the room above): its
    tokens, and the metrics its drafts are counted in."""

    @property
    def all_token_ids(self) -> list[int]: ...
    @property
    def metrics(self) -> RequestMetrics: ...


@dataclass(slots=True)
class _SequenceState:
    # n-gram -> index of the token that followed its latest occurrence
    index: dict[tuple[int, ...], int] = field(default_factory=dict)
    num_indexed: int = 0  # tokens before this one have their n-grams in the index
    kept: float = 0.0  # drafts kept and tried, decayed (see ACCEPTANCE_DECAY)
    tried: float = 0.0


class NgramProposer:
    """Proposes up to `num_speculative_tokens` drafts per sequence and estimates how often each
    sequence's drafts are kept: from the drafts verified, and from the first draft of a proposal
    that was not verified, checked against the token the step sampled instead (a shadow check,
    free), so a sequence whose drafts were not worth verifying is still measured."""

    def __init__(self, num_speculative_tokens: int, ngram_min: int, ngram_max: int) -> None:
        assert num_speculative_tokens > 0 and 1 <= ngram_min <= ngram_max
        self.num_speculative_tokens = num_speculative_tokens
        self.ngram_min = ngram_min
        self.ngram_max = ngram_max
        self.num_draft_tokens = 0
        self.num_accepted_tokens = 0
        self._states: dict[DraftedSequence, _SequenceState] = {}
        self._overall_kept = DEFAULT_ACCEPTANCE
        self._overall_tried = 1.0
        self.num_checked = 0  # drafts verified or shadow-checked, in all

    @property
    def acceptance_rate(self) -> float | None:
        if not self.num_draft_tokens:
            return None
        return self.num_accepted_tokens / self.num_draft_tokens

    def propose(self, seq: DraftedSequence, max_drafts: int) -> list[int]:
        """Drafts to follow `seq`'s tokens, at most `max_drafts` (which the caller bounds by
        max_tokens, the context length and the step's token budget)."""
        state = self._track(seq)
        limit = min(max_drafts, self.num_speculative_tokens)
        if limit <= 0:
            return []
        tokens = seq.all_token_ids
        self._index(state, tokens)
        follower = self._latest_match(state, tokens)
        if follower is None:
            return []
        return _continuation(tokens, follower, limit)

    def _track(self, seq: DraftedSequence) -> _SequenceState:
        """The sequence's state, made at its first proposal: its acceptance is learnt from
        then on."""
        state = self._states.get(seq)
        if state is None:
            state = self._states[seq] = _SequenceState()
        return state

    @property
    def overall_acceptance(self) -> float:
        """The engine-wide chance that a draft is kept, recent checks weighing most."""
        return self._overall_kept / self._overall_tried

    def acceptance(self, seq: DraftedSequence) -> float:
        """The estimated chance that each next draft of `seq` is kept."""
        overall = self.overall_acceptance
        state = self._states.get(seq)
        if state is None:
            return overall
        return (state.kept + PRIOR_TRIALS * overall) / (state.tried + PRIOR_TRIALS)

    def record(self, seq: DraftedSequence, num_drafted: int, num_accepted: int) -> None:
        """What verification made of `seq`'s drafts this step. Drafts after the first rejected
        one were not tried."""
        self.num_draft_tokens += num_drafted
        self.num_accepted_tokens += num_accepted
        seq.metrics.num_draft_tokens += num_drafted
        seq.metrics.num_accepted_tokens += num_accepted
        self._learn(seq, num_accepted, min(num_accepted + 1, num_drafted))

    def record_shadow(self, seq: DraftedSequence, kept: bool) -> None:
        """A proposal's first draft was not verified; the step sampled it (kept) or not."""
        self._learn(seq, int(kept), 1)

    def _learn(self, seq: DraftedSequence, kept: int, tried: int) -> None:
        self.num_checked += tried
        self._overall_kept = OVERALL_DECAY * self._overall_kept + kept
        self._overall_tried = OVERALL_DECAY * self._overall_tried + tried
        state = self._states.get(seq)
        if state is not None:
            state.kept = ACCEPTANCE_DECAY * state.kept + kept
            state.tried = ACCEPTANCE_DECAY * state.tried + tried

    def forget(self, seq: DraftedSequence) -> None:
        self._states.pop(seq, None)

    def _index(self, state: _SequenceState, tokens: list[int]) -> None:
        index, lo, hi = state.index, self.ngram_min, self.ngram_max
        for follower in range(max(state.num_indexed, 1), len(tokens)):
            for n in range(lo, min(hi, follower) + 1):
                index[tuple(tokens[follower - n:follower])] = follower
        state.num_indexed = len(tokens)

    def _latest_match(self, state: _SequenceState, tokens: list[int]) -> int | None:
        """Where the token after the latest earlier occurrence of the longest matching tail (of
        at least ngram_min tokens) is."""
        for n in range(min(self.ngram_max, len(tokens) - 1), self.ngram_min - 1, -1):
            follower = state.index.get(tuple(tokens[-n:]))
            if follower is not None:
                return follower
        return None


def _continuation(tokens: list[int], follower: int, limit: int) -> list[int]:
    """`limit` tokens from `follower` on; past the end the match repeats with its period, as in
    a loop (the tail itself is then the text that repeats)."""
    end = len(tokens)
    drafts: list[int] = []
    for pos in range(follower, follower + limit):
        drafts.append(tokens[pos] if pos < end else drafts[pos - end])
    return drafts
