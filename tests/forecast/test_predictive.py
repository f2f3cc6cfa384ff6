"""The verdict mixture: its quantiles against a truncated normal's closed form (computed with
``torch.distributions.Normal``), the probability it puts on holding, its median's side of the
bound, clipping to the range, and a regression value in the far tail."""

from __future__ import annotations

import math

import pytest
import torch

from headwise.forecast.predictive import VerdictMixture

NORMAL = torch.distributions.Normal(torch.tensor(0.0, dtype=torch.float64),
                                    torch.tensor(1.0, dtype=torch.float64))


def cdf(x: float) -> float:
    return float(NORMAL.cdf(torch.tensor(x, dtype=torch.float64)))


def icdf(p: float) -> float:
    return float(NORMAL.icdf(torch.tensor(p, dtype=torch.float64)))


def test_quantiles_are_the_verdicts_truncated_normals_weighted_by_the_probability() -> None:
    # F = 0.8 N(0.4, 0.2) | [0.5, inf) + 0.2 N(0.4, 0.2) | (-inf, 0.5), on an unbounded line
    m = VerdictMixture(0.8, 0.4, 0.2, 0.5, None, -math.inf, math.inf)
    alpha = cdf((0.5 - 0.4) / 0.2)
    assert m.quantile(0.2) == pytest.approx(0.5, abs=1e-9)  # the failing part's mass is 0.2
    for q in (0.05, 0.1, 0.15):  # inside the failing part: N | x < 0.5 at level q / 0.2
        assert m.quantile(q) == pytest.approx(0.4 + 0.2 * icdf(alpha * q / 0.2), abs=1e-9)
    for q in (0.3, 0.5, 0.95):  # inside the holding part: N | x >= 0.5 at (q - 0.2) / 0.8
        r = (q - 0.2) / 0.8
        assert m.quantile(q) == pytest.approx(0.4 + 0.2 * icdf(alpha + r * (1 - alpha)),
                                              abs=1e-9)


@pytest.mark.parametrize("mu", [-3.0, 0.0, 0.3, 0.6, 4.0])
@pytest.mark.parametrize("p", [0.02, 0.3, 0.49, 0.5, 0.51, 0.82, 0.99])
@pytest.mark.parametrize("bounds", [(0.5, None), (None, 0.3), (0.95, None), (0.2, 0.6)])
def test_the_median_holds_exactly_when_the_probability_is_one_half_or_more(
        mu: float, p: float, bounds: tuple[float | None, float | None]) -> None:
    at_least, at_most = bounds
    m = VerdictMixture(p, mu, 0.3, at_least, at_most, 0.0, 1.0)
    value = m.median()
    holds = (at_least is None or value >= at_least) and (at_most is None or value <= at_most)
    assert holds == (p >= 0.5)
    assert 0.0 <= m.quantile(0.05) <= value <= m.quantile(0.95) <= 1.0
    if at_most is None:  # one-sided: the failing part's mass ends at the bound
        assert m.quantile(1 - p - 1e-6) <= at_least <= m.quantile(1 - p + 1e-6)  # type: ignore[operator]


def test_a_clause_at_the_top_of_its_range_forecast_to_hold_is_forecast_at_the_top() -> None:
    # the pilot case: a score held at 1.000 against >= 0.95, a regression value far below and
    # wide: the holding part's mass above 1 is clipped to 1, the value that holds
    m = VerdictMixture(0.82, 0.0, 0.6, 0.95, None, 0.0, 1.0)
    assert m.median() == 1.0
    assert m.quantile(0.05) == 0.0  # 18% fail, most of that below 0 under this regression


def test_a_regression_value_in_the_far_tail_still_lands_on_the_probabilitys_side() -> None:
    # 100 standard deviations below a floor: the holding part's normal mass underflows; its
    # tail is an exponential of rate 100 / sigma beyond the bound, median ln 2 / 100 sigma
    m = VerdictMixture(0.9, -100.0, 1.0, 0.0, None, -math.inf, math.inf)
    value = m.median()
    # the median of the whole is the holding part's (0.5 - 0.1) / 0.9 quantile
    r = 0.4 / 0.9
    assert value == pytest.approx(-math.log1p(-r) / 100.0, rel=1e-2)
    # and the same at 30 standard deviations, where the exact form is still representable
    exact = VerdictMixture(0.9, -30.0, 1.0, 0.0, None, -math.inf, math.inf).median()
    assert exact == pytest.approx(-math.log1p(-r) / 30.0, rel=5e-3)
    cap = VerdictMixture(0.1, -100.0, 1.0, None, -80.0, -math.inf, math.inf)
    assert cap.median() > -80.0  # fails a cap 20 sd above the value: just above it


def test_a_bound_outside_the_range_decides_the_probability() -> None:
    never = VerdictMixture(0.7, 0.5, 0.1, 1.5, None, 0.0, 1.0)  # nothing in [0, 1] is >= 1.5
    always = VerdictMixture(0.2, 0.5, 0.1, 0.0, None, 0.0, 1.0)  # everything is >= 0
    assert never.effective_probability() == 0.0 and never.median() == pytest.approx(0.5)
    assert always.effective_probability() == 1.0 and always.median() == pytest.approx(0.5)
