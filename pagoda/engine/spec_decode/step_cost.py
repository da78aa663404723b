"""What a decode step costs on this machine, with these weights, by its number of rows.

Verifying k drafts makes a sequence's step k+1 rows instead of one. Whether that is nearly free
(a GPU, or a CPU whose step is bound by reading the weights once) or costs almost k+1 times as
much (a CPU whose matrix kernels are compute-bound for a few rows) is measured, not assumed: a
short calibration at load fills the table, and every decode step the engine times refines it.

Between and beyond the measured row counts, a dense model's cost runs on in proportion to its
rows. A mixture of experts' does not: its experts' weights are read once for all the rows routed
to each, so what its rows cost grows with the number of distinct experts they read, which
saturates at all of them (`ExpertStepWork`). Its table is interpolated in that measure instead.
"""

from __future__ import annotations

import bisect
import itertools
from collections.abc import Callable
from dataclasses import dataclass

# How far one timed step moves the estimate for its number of rows. Whatever else the machine
# does only ever adds time, so a faster step is believed more than a slower one: a step slowed
# by a neighbour moves the estimate a tenth of the way, a steady change (a longer context) is
# followed within a couple of dozen steps.
FASTER_WEIGHT = 0.5
SLOWER_WEIGHT = 0.1


@dataclass(slots=True, frozen=True)
class ExpertStepWork:
    """A mixture of experts' step of n rows in rows of a dense step: `dense_share` of the
    weights one row reads (attention, the router, a shared expert, the vocabulary) is read once
    a step and computed for each row, as a dense model's; the rest, the routed experts', is read
    once for each distinct expert the rows choose, E * (1 - (1 - k/E)^n) of them were every row
    to choose its k apart and every expert alike (one row reads k). So 32 rows of a 30B-A3B
    (8 of 128 experts, 60% of what a token reads in experts) cost 21 rows' worth, not 32, and
    512 rows 217. Real routers favour some experts, so rows share more experts than this
    counts: the estimate errs towards a dearer step, and the timed steps refine it."""

    num_experts: int
    top_k: int
    dense_share: float

    def __post_init__(self) -> None:
        if not (0 < self.top_k <= self.num_experts and 0.0 <= self.dense_share <= 1.0):
            raise ValueError(f"top {self.top_k} of {self.num_experts} experts, dense share "
                             f"{self.dense_share}")

    def distinct_experts(self, rows: int) -> float:
        """The expected number of experts a sparse layer reads for a step of `rows` rows."""
        return self.num_experts * (1.0 - (1.0 - self.top_k / self.num_experts) ** rows)

    def __call__(self, rows: int) -> float:
        routed = self.distinct_experts(rows) / self.top_k
        return self.dense_share * rows + (1.0 - self.dense_share) * routed


class StepCost:
    """Seconds of a decode step by number of rows. Rows between two measured counts are
    interpolated; beyond the largest, the last measured slope continues; below the smallest,
    the smallest's time holds. A step is never taken as cheaper than one of fewer rows: a
    noisy measurement that says so is read as the fewer rows' time.

    work: what a step of n rows costs in rows of a dense model's step, the measure the table is
    interpolated in: n itself for a dense model (None), an ExpertStepWork for a mixture of
    experts."""

    def __init__(self, seconds_by_rows: dict[int, float] | None = None,
                 work: Callable[[int], float] | None = None) -> None:
        self._work = work or float
        self._seconds: dict[int, float] = {}
        self._rows: list[int] = []  # sorted keys of _seconds
        self._floors: list[float] = []  # by _rows: each time at least the one before it
        for rows, seconds in (seconds_by_rows or {}).items():
            self._set(rows, seconds)

    @property
    def is_known(self) -> bool:
        return bool(self._rows)

    def table(self) -> dict[int, float]:
        return {rows: self._seconds[rows] for rows in self._rows}

    def observe(self, rows: int, seconds: float) -> None:
        """A timed step of `rows` rows."""
        if rows < 1 or seconds <= 0:
            return
        known = self._seconds.get(rows)
        if known is None:
            self._set(rows, seconds)
            return
        weight = FASTER_WEIGHT if seconds < known else SLOWER_WEIGHT
        self._set(rows, known + weight * (seconds - known))

    def seconds(self, rows: int) -> float:
        """The estimated time of a step of `rows` rows (0.0 while nothing is measured)."""
        if not self._rows:
            return 0.0
        keys, times = self._rows, self._floors
        at = bisect.bisect_left(keys, rows)
        if at < len(keys) and keys[at] == rows:
            return times[at]
        if at == 0 or len(keys) == 1:
            return times[0]
        lo = at - 1 if at < len(keys) else len(keys) - 2
        work = self._work
        slope = (times[lo + 1] - times[lo]) / (work(keys[lo + 1]) - work(keys[lo]))
        return times[lo] + slope * (work(rows) - work(keys[lo]))

    def ratio(self, rows: int, base_rows: int) -> float:
        """How many times a step of `base_rows` rows a step of `rows` rows costs."""
        base = self.seconds(base_rows)
        return self.seconds(rows) / base if base > 0 else 1.0

    def _set(self, rows: int, seconds: float) -> None:
        if rows not in self._seconds:
            bisect.insort(self._rows, rows)
        self._seconds[rows] = seconds
        self._floors = list(itertools.accumulate((self._seconds[r] for r in self._rows), max))
