"""What a decode step costs on this machine, with these weights, by its number of rows.

Verifying k drafts makes a sequence's step k+1 rows instead of one. Whether that is nearly free
(a GPU, or a CPU whose step is bound by reading the weights once) or costs almost k+1 times as
much (a CPU whose matrix kernels are compute-bound for a few rows) is measured, not assumed: a
short calibration at load fills the table, and every decode step the engine times refines it.
"""

from __future__ import annotations

import bisect
import itertools

# How far one timed step moves the estimate for its number of rows. Whatever else the machine
# does only ever adds time, so a faster step is believed more than a slower one: a step slowed
# by a neighbour moves the estimate a tenth of the way, a steady change (a longer context) is
# followed within a couple of dozen steps.
FASTER_WEIGHT = 0.5
SLOWER_WEIGHT = 0.1


class StepCost:
    """Seconds of a decode step by number of rows. Rows between two measured counts are
    interpolated; beyond the largest, the last measured slope continues; below the smallest,
    the smallest's time holds. A step is never taken as cheaper than one of fewer rows: a
    noisy measurement that says so is read as the fewer rows' time."""

    def __init__(self, seconds_by_rows: dict[int, float] | None = None) -> None:
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
        slope = (times[lo + 1] - times[lo]) / (keys[lo + 1] - keys[lo])
        return times[lo] + slope * (rows - keys[lo])

    def ratio(self, rows: int, base_rows: int) -> float:
        """How many times a step of `base_rows` rows a step of `rows` rows costs."""
        base = self.seconds(base_rows)
        return self.seconds(rows) / base if base > 0 else 1.0

    def _set(self, rows: int, seconds: float) -> None:
        if rows not in self._seconds:
            bisect.insort(self._rows, rows)
        self._seconds[rows] = seconds
        self._floors = list(itertools.accumulate((self._seconds[r] for r in self._rows), max))
