"""Drafts from two sources, for a model whose file has a multi-token-prediction block
(pagoda.engine.models.mtp): the block's drafts, made by the runner at the end of each step for
the step after, and prompt lookup's (pagoda.engine.spec_decode.ngram_proposer), the fallback.

Each source keeps its own acceptance per sequence (verified drafts and shadow checks, as prompt
lookup does). Each step a sequence gets the proposal that is expected to keep more tokens: the
j-th draft of a source whose drafts are kept with probability a is kept with probability a^j,
so n drafts of either are worth a + a^2 + ... + a^n. How many of them to verify, if any, is
then the cost model's choice (pagoda.engine.spec_decode.draft_policy) as for prompt lookup
alone; a proposal not verified is shadow-checked against its source.

The block runs every step whether its drafts are verified or not (its KV cache must follow each
sequence), so it must pay for itself as a whole, and each draft it chains after its first must
pay for its own pass: `drafts_that_pay` weighs what n drafts are worth (1 + a + ... + a^n
tokens a step) against a step verifying them here (the step cost's table, whose steps count the
block's first pass) and the n - 1 chained passes, beside a plain step without the block. The
engine asks the block for the best n, at most num_speculative_tokens; once none pays, it stops
running the block and prompt lookup drafts alone (for the engine's life: the block's keys of
the running sequences would be missing).
"""

from __future__ import annotations

from pagoda.engine.spec_decode.draft_policy import SPEEDUP_MARGIN
from pagoda.engine.spec_decode.ngram_proposer import DraftedSequence, NgramProposer
from pagoda.engine.spec_decode.step_cost import StepCost

# The block's drafts checked (verified or shadow-checked) before its worth is judged.
MIN_BLOCK_CHECKS = 32


class ModelDrafts(NgramProposer):
    """The block's drafts as a proposer: the latest offered for each sequence, proposed while
    the sequence has not moved since (a preempted or stopped one has); acceptance kept as
    prompt lookup keeps its own."""

    def __init__(self, num_speculative_tokens: int) -> None:
        super().__init__(num_speculative_tokens, 1, 1)
        self._offered: dict[DraftedSequence, tuple[int, list[int]]] = {}

    def offer(self, seq: DraftedSequence, drafts: list[int]) -> None:
        """Drafts to follow the sequence's tokens as they are now."""
        self._offered[seq] = (len(seq.all_token_ids), drafts)

    def propose(self, seq: DraftedSequence, max_drafts: int) -> list[int]:
        self._track(seq)
        num_tokens, drafts = self._offered.get(seq, (-1, []))
        if num_tokens != len(seq.all_token_ids):
            return []
        return drafts[:max(0, min(max_drafts, self.num_speculative_tokens))]

    def forget(self, seq: DraftedSequence) -> None:
        super().forget(seq)
        self._offered.pop(seq, None)


class DraftSources:
    """The proposer the scheduler sees where the model drafts: NgramProposer's interface, each
    call answered by the source chosen for the sequence's latest proposal."""

    def __init__(self, model: ModelDrafts, lookup: NgramProposer) -> None:
        self.model = model
        self.lookup = lookup
        self._chosen: dict[DraftedSequence, NgramProposer] = {}

    @property
    def num_draft_tokens(self) -> int:
        return self.model.num_draft_tokens + self.lookup.num_draft_tokens

    @property
    def num_accepted_tokens(self) -> int:
        return self.model.num_accepted_tokens + self.lookup.num_accepted_tokens

    @property
    def acceptance_rate(self) -> float | None:
        drafted = self.num_draft_tokens
        return self.num_accepted_tokens / drafted if drafted else None

    def offer(self, seq: DraftedSequence, drafts: list[int]) -> None:
        self.model.offer(seq, drafts)

    def propose(self, seq: DraftedSequence, max_drafts: int) -> list[int]:
        proposals = [(source, source.propose(seq, max_drafts))
                     for source in (self.model, self.lookup)]
        source, drafts = max(proposals, key=lambda p: _expected_kept(p[0].acceptance(seq),
                                                                     len(p[1])))
        self._chosen[seq] = source
        return drafts

    def acceptance(self, seq: DraftedSequence) -> float:
        return self._source(seq).acceptance(seq)

    def record(self, seq: DraftedSequence, num_drafted: int, num_accepted: int) -> None:
        self._source(seq).record(seq, num_drafted, num_accepted)

    def record_shadow(self, seq: DraftedSequence, kept: bool) -> None:
        self._source(seq).record_shadow(seq, kept)

    def forget(self, seq: DraftedSequence) -> None:
        self.model.forget(seq)
        self.lookup.forget(seq)
        self._chosen.pop(seq, None)

    def _source(self, seq: DraftedSequence) -> NgramProposer:
        return self._chosen.get(seq, self.model)


def _expected_kept(acceptance: float, num_drafts: int) -> float:
    """The drafts expected to be kept of a proposal of num_drafts (0 for none)."""
    return sum(acceptance ** j for j in range(1, num_drafts + 1))


def drafts_that_pay(acceptance: float, cost: StepCost, block_seconds: float,
                    pass_seconds: float, max_drafts: int) -> int:
    """How many drafts the block should make a step (0: none pays, stop it), for one stream
    whose drafts are each kept with probability `acceptance`: n drafts yield 1 + a + ... + a^n
    tokens in a step of 1 + n rows (`cost`, the block's first pass included) and n - 1 chained
    passes of pass_seconds; a step without the block yields one in cost.seconds(1) less
    block_seconds. The n with the most tokens per second, if it beats that by the margin."""
    plain = cost.seconds(1) - block_seconds
    if plain <= 0:
        return max_drafts  # not measured yet
    best, best_rate, tokens = 0, (1 + SPEEDUP_MARGIN) / plain, 1.0
    for n in range(1, max_drafts + 1):
        tokens += acceptance ** n
        rate = tokens / (cost.seconds(1 + n) + (n - 1) * pass_seconds)
        if rate >= best_rate:
            best, best_rate = n, rate
    return best
