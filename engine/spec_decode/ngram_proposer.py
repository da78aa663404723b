"""Prompt lookup: the tokens that followed the latest earlier occurrence of the context's tail.

No second model: each sequence keeps an index from every n-gram of its tokens (n in
[ngram_min, ngram_max]) to where that n-gram last occurred, updated with the new tokens only, so a
proposal costs a few dictionary lookups however long the context is.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from engine.sequence import Sequence

# A sequence whose drafts are rarely accepted pauses, so open-ended text pays for few failed
# verifications; only a match of the longest n-gram, strong evidence that the text is being
# copied again, drafts during a pause. The rate is judged over windows of at least this many
# drafted tokens...
ADAPTIVE_WINDOW_DRAFTS = 8
# ...and a window accepting less than this fraction starts a pause...
ADAPTIVE_MIN_ACCEPTANCE = 0.3
# ...of this many steps, doubled after each further failing window up to the maximum, and reset
# by a window that passes.
ADAPTIVE_PAUSE_STEPS = 16
ADAPTIVE_MAX_PAUSE_STEPS = 256


@dataclass(slots=True)
class _SequenceState:
    # n-gram -> index of the token that followed its latest occurrence
    index: dict[tuple[int, ...], int] = field(default_factory=dict)
    num_indexed: int = 0  # tokens before this one have their n-grams in the index
    window_drafted: int = 0
    window_accepted: int = 0
    pause_steps: int = 0  # steps left without proposing
    next_pause: int = ADAPTIVE_PAUSE_STEPS


class NgramProposer:
    """Proposes up to `num_speculative_tokens` drafts per sequence and learns when to stop."""

    def __init__(self, num_speculative_tokens: int, ngram_min: int, ngram_max: int) -> None:
        assert num_speculative_tokens > 0 and 1 <= ngram_min <= ngram_max
        self.num_speculative_tokens = num_speculative_tokens
        self.ngram_min = ngram_min
        self.ngram_max = ngram_max
        self.num_draft_tokens = 0
        self.num_accepted_tokens = 0
        self._states: dict[Sequence, _SequenceState] = {}

    @property
    def acceptance_rate(self) -> float | None:
        if not self.num_draft_tokens:
            return None
        return self.num_accepted_tokens / self.num_draft_tokens

    def propose(self, seq: Sequence, max_drafts: int) -> list[int]:
        """Drafts to follow `seq`'s tokens, at most `max_drafts` (which the caller bounds by
        max_tokens, the context length and the step's token budget)."""
        state = self._states.get(seq)
        if state is None:
            state = self._states[seq] = _SequenceState()
        shortest = self.ngram_min
        if state.pause_steps > 0:
            state.pause_steps -= 1
            shortest = self.ngram_max
        limit = min(max_drafts, self.num_speculative_tokens)
        if limit <= 0:
            return []
        tokens = seq.all_token_ids
        self._index(state, tokens)
        follower = self._latest_match(state, tokens, shortest)
        if follower is None:
            return []
        return _continuation(tokens, follower, limit)

    def record(self, seq: Sequence, num_drafted: int, num_accepted: int) -> None:
        """What verification made of `seq`'s drafts this step."""
        self.num_draft_tokens += num_drafted
        self.num_accepted_tokens += num_accepted
        seq.metrics.num_draft_tokens += num_drafted
        seq.metrics.num_accepted_tokens += num_accepted
        state = self._states.get(seq)
        if state is None:
            return
        state.window_drafted += num_drafted
        state.window_accepted += num_accepted
        if state.window_drafted < ADAPTIVE_WINDOW_DRAFTS:
            return
        if state.window_accepted < ADAPTIVE_MIN_ACCEPTANCE * state.window_drafted:
            state.pause_steps = state.next_pause
            state.next_pause = min(2 * state.next_pause, ADAPTIVE_MAX_PAUSE_STEPS)
        else:
            state.next_pause = ADAPTIVE_PAUSE_STEPS
        state.window_drafted = state.window_accepted = 0

    def forget(self, seq: Sequence) -> None:
        self._states.pop(seq, None)

    def _index(self, state: _SequenceState, tokens: list[int]) -> None:
        index, lo, hi = state.index, self.ngram_min, self.ngram_max
        for follower in range(max(state.num_indexed, 1), len(tokens)):
            for n in range(lo, min(hi, follower) + 1):
                index[tuple(tokens[follower - n:follower])] = follower
        state.num_indexed = len(tokens)

    def _latest_match(self, state: _SequenceState, tokens: list[int],
                      shortest: int) -> int | None:
        """Where the token after the latest earlier occurrence of the longest matching tail (of
        at least `shortest` tokens) is."""
        for n in range(min(self.ngram_max, len(tokens) - 1), shortest - 1, -1):
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
