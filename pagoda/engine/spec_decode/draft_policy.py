"""How many drafts to verify this step: as many as make tokens per second higher.

A step of `base_rows` rows yields `base_tokens` tokens (one per sequence that samples). Each
draft adds a row; the j-th draft of a sequence whose drafts are accepted with probability a is
kept with probability a**j (every draft before it must be kept too). For each total number of
drafts m, the m drafts most likely to be kept are the ones to verify, and the step then yields
base_tokens plus their probabilities, in the time StepCost gives for base_rows + m rows. The
plan is the m with the most tokens per second; drafts must beat a plain step by a margin, so
measurement noise does not buy drafts that do not pay.
"""

from __future__ import annotations

import heapq
from collections import deque
from dataclasses import dataclass, field

from pagoda.engine.spec_decode.step_cost import StepCost

# Drafts are verified only when the model expects at least this much more tokens per second.
SPEEDUP_MARGIN = 0.02
# What the engine reports as on or off is the trend of this many recent steps that had drafts
# to offer: each step decides anew, so the latest step alone flips from poll to poll. The trend
# turns on once at least ON_SHARE of them verified drafts and off once at most OFF_SHARE did.
TREND_STEPS = 256
ON_SHARE, OFF_SHARE = 0.6, 0.4


@dataclass(slots=True, frozen=True)
class DraftCandidate:
    """A sequence that samples this step and has drafts proposed for it."""

    acceptance: float  # the chance that each next draft is kept, estimated for this sequence
    num_available: int  # drafts the proposer found (it may find fewer than allowed)


@dataclass(slots=True, frozen=True)
class DraftPlan:
    """num_drafts: per candidate, how many of its drafts to verify. cost_ratio: the cost of
    the planned step over a plain one; when no draft is planned, that of the cheapest step with
    one draft, the one that did not pay. acceptance: the best candidate's."""

    num_drafts: list[int]
    base_rows: int
    acceptance: float
    cost_ratio: float
    speedup: float  # expected tokens per second over a plain step's

    @property
    def total(self) -> int:
        return sum(self.num_drafts)

    def headline(self) -> str:
        """On or off, in a few words: "drafts off: 13% accepted"."""
        return f"drafts {'on' if self.total else 'off'}: {self.acceptance:.0%} accepted"

    def reason(self) -> str:
        """Why, in words: the headline and what verifying costs here."""
        rows = self.base_rows + max(self.total, 1)
        cost = (f"a {rows}-row step costs {self.cost_ratio:.2f}x a {self.base_rows}-row step "
                "here")
        return f"{self.headline()}; {cost}" if self.total else f"{self.headline()}, and {cost}"


@dataclass(slots=True)
class DraftingTrend:
    """Whether drafts are verified lately, steadier than any one step's plan: the share of the
    last TREND_STEPS steps that had drafts to offer and verified some, and an on/off state that
    changes only once that share has moved past ON_SHARE or OFF_SHARE."""

    steps: deque[bool] = field(default_factory=lambda: deque(maxlen=TREND_STEPS))
    on: bool = False
    latest: DraftPlan | None = None

    def record(self, plan: DraftPlan) -> None:
        self.latest = plan
        self.steps.append(plan.total > 0)
        if self.share >= ON_SHARE:
            self.on = True
        elif self.share <= OFF_SHARE:
            self.on = False

    @property
    def share(self) -> float:
        return sum(self.steps) / len(self.steps) if self.steps else 0.0

    def headline(self) -> str | None:
        """"drafts on: 60% accepted" (the latest acceptance); None before any step drafted."""
        if self.latest is None:
            return None
        return f"drafts {'on' if self.on else 'off'}: {self.latest.acceptance:.0%} accepted"

    def reason(self) -> str | None:
        """Why: how often recent steps verified drafts, and the latest step's plan."""
        if self.latest is None:
            return None
        return (f"drafts verified in {self.share:.0%} of the last {len(self.steps)} steps "
                f"that had some to offer; the latest: {self.latest.reason()}")


def plan_drafts(cost: StepCost, base_rows: int, base_tokens: int,
                candidates: list[DraftCandidate], max_total: int) -> DraftPlan:
    """The drafts to verify, at most max_total in all (what the step's token budget leaves)."""
    # (probability it is kept, candidate) for every draft that could be verified; the j-th
    # draft of one candidate is never more likely than its (j-1)-th, so any top m of them is
    # a prefix of each candidate's drafts.
    gains = [(c.acceptance ** j, i) for i, c in enumerate(candidates)
             for j in range(1, c.num_available + 1)]
    chosen = heapq.nlargest(min(max_total, len(gains)), gains)
    acceptance = max((c.acceptance for c in candidates if c.num_available), default=0.0)
    if not cost.is_known:  # nothing measured (a bare scheduler): rows taken as free
        return DraftPlan(_per_candidate(chosen, len(candidates)), base_rows, acceptance, 1.0,
                         1.0)
    plain = base_tokens / cost.seconds(base_rows)
    best_m, best_rate, tokens = 0, plain, float(base_tokens)
    for m, (gain, _) in enumerate(chosen, 1):
        tokens += gain
        rate = tokens / cost.seconds(base_rows + m)
        if rate > best_rate and rate >= plain * (1 + SPEEDUP_MARGIN):
            best_m, best_rate = m, rate
    return DraftPlan(_per_candidate(chosen[:best_m], len(candidates)), base_rows, acceptance,
                     cost.ratio(base_rows + max(best_m, 1), base_rows), best_rate / plain)


def _per_candidate(chosen: list[tuple[float, int]], num_candidates: int) -> list[int]:
    num_drafts = [0] * num_candidates
    for _, i in chosen:
        num_drafts[i] += 1
    return num_drafts
