"""Scores of forecasts against outcomes: the paired sign test, the Brier score, calibration.

Plain numbers from plain lists; the benchmarks print them beside their forecasts.
"""

from __future__ import annotations

import math
from collections.abc import Sequence


def sign_test(wins: int, losses: int) -> float:
    """Exact two-sided sign test (McNemar's exact test) of ``wins`` vs ``losses``: the chance
    of a split at least this uneven if either forecaster were as likely to be the right one,

        p = min(1, 2 * sum_{i <= min(w, l)} C(w + l, i) / 2^(w + l))   (1 when w + l = 0)
    """
    n, k = wins + losses, min(wins, losses)
    return min(1.0, 2 * sum(math.comb(n, i) for i in range(k + 1)) / 2 ** n) if n else 1.0


def brier(probabilities: Sequence[float], outcomes: Sequence[bool]) -> float:
    """Mean squared difference between stated probabilities and 0/1 outcomes."""
    return sum((p - float(o)) ** 2 for p, o in zip(probabilities, outcomes, strict=True)) / max(
        1, len(outcomes))


def calibration_bins(probabilities: Sequence[float], outcomes: Sequence[bool],
                     bins: int = 10) -> list[tuple[float, float, float, int]]:
    """Per non-empty bin of ``bins`` equal-width bins of the stated probability of holding
    (the last bin closed): (its lower edge, the mean stated probability, the share that held,
    how many)."""
    out = []
    for b in range(bins):
        lo, hi = b / bins, (b + 1) / bins
        sel = [(p, o) for p, o in zip(probabilities, outcomes, strict=True)
               if lo <= p < hi or (b == bins - 1 and p == 1.0)]
        if sel:
            out.append((lo, sum(p for p, _ in sel) / len(sel),
                        sum(float(o) for _, o in sel) / len(sel), len(sel)))
    return out


def expected_calibration_error(probabilities: Sequence[float], outcomes: Sequence[bool],
                               bins: int = 10) -> float:
    """``sum_b n_b / N * |freq_b - mean_p_b|`` over ``calibration_bins``."""
    total = max(1, len(outcomes))
    return sum(n / total * abs(held - mean_p)
               for _, mean_p, held, n in calibration_bins(probabilities, outcomes, bins))
