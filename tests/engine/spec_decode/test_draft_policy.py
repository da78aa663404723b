"""When drafts pay: the step cost table and the plan it gives, against synthetic costs.

The costs are the two kinds of machine the issue names: one where a few more rows are nearly
free (a GPU, a CPU bound by reading the weights) and the 2-core AMD EPYC where they are not
(fp32, 30 layers: 1 row 55.6 ms, 4 rows 111 ms).
"""

from __future__ import annotations

import pytest

from pagoda.engine.core.sequence import Sequence
from pagoda.engine.sampling.params import SamplingParams
from pagoda.engine.spec_decode.draft_policy import TREND_STEPS, DraftCandidate, DraftingTrend, plan_drafts
from pagoda.engine.spec_decode.ngram_proposer import NgramProposer
from pagoda.engine.spec_decode.step_cost import FASTER_WEIGHT, SLOWER_WEIGHT, StepCost

FREE_ROWS = StepCost({1: 0.0100, 2: 0.0101, 3: 0.0102, 6: 0.0110, 12: 0.0125})
COSTLY_ROWS = StepCost({1: 0.0556, 4: 0.111})


def plan(cost: StepCost, *acceptances: float, available: int = 2, budget: int = 512):
    candidates = [DraftCandidate(a, available) for a in acceptances]
    n = len(candidates)
    return plan_drafts(cost, base_rows=n, base_tokens=n, candidates=candidates,
                       max_total=budget)


def test_between_two_measured_row_counts_the_cost_is_interpolated_and_beyond_extrapolated():
    assert COSTLY_ROWS.seconds(1) == 0.0556
    assert COSTLY_ROWS.seconds(2) == pytest.approx(0.0556 + (0.111 - 0.0556) / 3)
    assert COSTLY_ROWS.seconds(7) == pytest.approx(0.111 + 3 * (0.111 - 0.0556) / 3)
    assert StepCost({4: 0.02}).seconds(1) == 0.02  # never cheaper than the fewest rows timed
    assert StepCost().seconds(3) == 0.0 and not StepCost().is_known


def test_a_timed_step_moves_its_rows_estimate_part_of_the_way_and_a_slow_one_less():
    cost = StepCost({1: 0.010, 2: 0.020})
    cost.observe(1, 0.020)
    cost.observe(2, 0.010)
    cost.observe(3, 0.030)  # a row count never timed takes the time as it is

    assert cost.seconds(1) == pytest.approx(0.010 + SLOWER_WEIGHT * 0.010)
    assert cost.seconds(2) == pytest.approx(0.020 - FASTER_WEIGHT * 0.010)
    assert cost.seconds(3) == 0.030


def test_nearly_free_rows_verify_drafts_even_when_few_are_kept():
    chosen = plan(FREE_ROWS, 0.3)

    assert chosen.num_drafts == [2]
    assert chosen.reason() == "drafts on: 30% accepted; a 3-row step costs 1.02x a 1-row step here"


def test_costly_rows_and_low_acceptance_verify_nothing_and_say_why():
    chosen = plan(COSTLY_ROWS, 0.13)

    assert chosen.num_drafts == [0] and chosen.speedup == 1.0
    assert chosen.reason() == ("drafts off: 13% accepted, and a 2-row step costs 1.33x a 1-row "
                               "step here")


@pytest.mark.parametrize(("acceptance", "want"), [(0.9, 2), (0.5, 1), (0.13, 0)])
def test_on_costly_rows_the_number_of_drafts_follows_the_acceptance(acceptance, want):
    assert plan(COSTLY_ROWS, acceptance).num_drafts == [want]


def test_a_change_of_acceptance_mid_reply_changes_the_drafts():
    proposer = NgramProposer(2, 1, 4)
    seq = Sequence("r", [1, 2, 3, 1, 2, 3, 1], SamplingParams(), frozenset())
    drafts = []
    for verified in [(2, 2)] * 12 + [(2, 0)] * 24:  # copying, then writing something new
        proposer.propose(seq, 2)
        proposer.record(seq, *verified)
        candidate = DraftCandidate(proposer.acceptance(seq), 2)
        drafts.append(plan_drafts(COSTLY_ROWS, 1, 1, [candidate], 512).total)
    for _ in range(20):  # no drafts verified, but the shadow checks see copying again
        proposer.record_shadow(seq, kept=True)
    candidate = DraftCandidate(proposer.acceptance(seq), 2)

    assert drafts[11] == 2 and drafts[-1] == 0
    assert plan_drafts(COSTLY_ROWS, 1, 1, [candidate], 512).total == 2


def test_in_a_batch_the_drafts_most_likely_kept_are_verified_first():
    # Four decodes: a fifth row costs 1/3 of a row's share here, so only sure drafts pay.
    chosen = plan(COSTLY_ROWS, 0.95, 0.2, 0.1, 0.92)

    assert chosen.num_drafts[1:3] == [0, 0]
    assert chosen.num_drafts[0] >= 1 and chosen.num_drafts[3] >= 1


def test_the_plan_stays_within_the_steps_token_budget_and_the_drafts_found():
    assert plan(FREE_ROWS, 0.9, 0.9, budget=3).total == 3
    assert plan(FREE_ROWS, 0.9, available=1).num_drafts == [1]
    assert plan(FREE_ROWS, 0.9, available=0).num_drafts == [0]


def test_without_a_measured_cost_every_draft_found_is_verified():
    assert plan(StepCost(), 0.01, 0.01).num_drafts == [2, 2]


def test_a_step_is_never_taken_as_cheaper_than_one_with_fewer_rows():
    noisy = StepCost({1: 0.050, 2: 0.030, 3: 0.070})

    assert noisy.seconds(2) == 0.050 and noisy.ratio(2, 1) == 1.0
    assert noisy.seconds(5) == pytest.approx(0.070 + 2 * 0.020)


def test_the_reported_state_follows_the_trend_not_each_steps_decision():
    drafts, none = plan(FREE_ROWS, 0.9), plan(COSTLY_ROWS, 0.1)
    assert drafts.total and not none.total
    trend = DraftingTrend()
    trend.record(drafts)
    assert trend.headline().startswith("drafts on")

    headlines = set()
    for step in range(40):  # steps alternating, as several chats' decisions do
        trend.record(drafts if step % 2 else none)
        headlines.add(trend.headline().split(":")[0])
    assert headlines == {"drafts on"}
    assert "verified in 51% of the last 41 steps" in trend.reason()

    for _ in range(TREND_STEPS):  # drafts stop paying for good
        trend.record(none)
    assert trend.headline().startswith("drafts off") and trend.share == 0.0
