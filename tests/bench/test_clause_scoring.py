"""The clause forecast benchmarks' baseline (bench/lab/clause_scoring.py): a straight line."""

from __future__ import annotations

from bench.lab.clause_scoring import extrapolation_holds
from headwise.forecast.clauses import ClauseTrajectory

TOTAL = 400
STEPS = tuple(range(20, TOTAL + 1, 20))


def test_the_baseline_extrapolates_a_line_exactly() -> None:
    # value = 0.1 + 0.5 * step / 400: at 20% (steps <= 80) the line through the latest half of
    # the early points reaches 0.6 at the end, which meets 0.55 and not 0.65
    values = tuple(0.1 + 0.5 * s / TOTAL for s in STEPS)
    for bound, expected in ((0.55, True), (0.65, False)):
        floor = ClauseTrajectory(STEPS, values, (0.01,) * len(STEPS), bound, None, TOTAL,
                                 False, 0.0, 1.0)
        assert extrapolation_holds(floor, 0.2) is expected
        cap = ClauseTrajectory(STEPS, values, (0.01,) * len(STEPS), None, bound, TOTAL, False,
                               0.0, 1.0)
        assert extrapolation_holds(cap, 0.2) is not expected
