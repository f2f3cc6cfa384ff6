"""Scores of forecasts against outcomes (bench/lab/scoring.py), against closed forms."""

from __future__ import annotations

import math

import pytest

from bench.lab.scoring import brier, calibration_bins, expected_calibration_error, sign_test


def test_sign_test_matches_the_binomial_tail() -> None:
    assert sign_test(0, 0) == 1.0
    assert sign_test(7, 7) == 1.0
    assert sign_test(0, 9) == pytest.approx(2 / 2 ** 9)
    assert sign_test(9, 0) == sign_test(0, 9)
    # 7 wins, 22 losses: 2 * P(X <= 7), X ~ Binomial(29, 1/2)
    assert sign_test(7, 22) == pytest.approx(
        2 * sum(math.comb(29, i) for i in range(8)) / 2 ** 29)
    assert sign_test(1, 2) == 1.0  # 2 * (1 + 3) / 8 = 1, capped at 1


def test_calibration_and_brier_match_their_closed_forms() -> None:
    p, y = [0.05, 0.15, 0.95, 0.95], [False, True, True, False]
    # bins: [0, 0.1): 0.05 vs 0; [0.1, 0.2): 0.15 vs 1; [0.9, 1]: 0.95 vs 0.5
    assert calibration_bins(p, y) == [(0.0, 0.05, 0.0, 1), (0.1, 0.15, 1.0, 1),
                                      (0.9, 0.95, 0.5, 2)]
    assert expected_calibration_error(p, y) == pytest.approx(
        0.25 * 0.05 + 0.25 * 0.85 + 0.5 * 0.45)
    assert brier(p, y) == pytest.approx((0.05 ** 2 + 0.85 ** 2 + 0.05 ** 2 + 0.95 ** 2) / 4)
    assert expected_calibration_error([1.0, 1.0], [True, True]) == 0.0
