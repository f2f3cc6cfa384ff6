"""The bounds' maths against closed forms, tabulated values and simulation."""

from __future__ import annotations

import math
from statistics import NormalDist

import pytest
import torch

from headwise.analysis.importance_matrix import ratio_skewness, ratio_stderr
from headwise.confidence import (
    BOOTSTRAP_T,
    beta_quantile,
    betainc,
    binomial_lower,
    binomial_p,
    binomial_upper,
    bootstrap_t,
    bootstrap_t_side,
    difference_lower,
    difference_p,
    examples_for_binomial,
    examples_for_difference,
    examples_for_location,
    holm,
    location_p,
    skew_term,
    skewed_location_p,
    skewed_t,
    skewed_t_inverse,
    t_cdf,
    t_quantile,
)


@pytest.mark.parametrize("x", [0.01, 0.2, 0.5, 0.77, 0.999])
@pytest.mark.parametrize("s", [0.5, 1.0, 3.0, 40.0])
def test_incomplete_beta_closed_forms(x: float, s: float) -> None:
    assert betainc(1.0, s, x) == pytest.approx(1.0 - (1.0 - x) ** s, rel=1e-12, abs=1e-14)
    assert betainc(s, 1.0, x) == pytest.approx(x ** s, rel=1e-12, abs=1e-14)
    assert betainc(s, s, 0.5) == pytest.approx(0.5, abs=1e-13)
    assert betainc(s, 2.5, x) == pytest.approx(1.0 - betainc(2.5, s, 1.0 - x), abs=1e-13)


@pytest.mark.parametrize(("k", "n", "p"), [(0, 7, 0.3), (3, 10, 0.25), (17, 40, 0.6),
                                           (199, 200, 0.97), (450, 1000, 0.46)])
def test_the_binomial_tail_is_the_incomplete_beta(k: int, n: int, p: float) -> None:
    tail = sum(math.comb(n, j) * p ** j * (1 - p) ** (n - j) for j in range(k, n + 1))
    assert binomial_p(k, n, p, "at_least") == pytest.approx(tail, rel=1e-10, abs=1e-15)
    head = sum(math.comb(n, j) * p ** j * (1 - p) ** (n - j) for j in range(k + 1))
    assert binomial_p(k, n, p, "at_most") == pytest.approx(head, rel=1e-10, abs=1e-15)


@pytest.mark.parametrize("n", [1, 5, 29, 200, 5000])
@pytest.mark.parametrize("confidence", [0.9, 0.95, 0.99])
def test_clopper_pearson_all_and_none_right(n: int, confidence: float) -> None:
    alpha = 1 - confidence
    assert binomial_lower(n, n, confidence) == pytest.approx(alpha ** (1 / n), rel=1e-12)
    assert binomial_upper(0, n, confidence) == pytest.approx(1 - alpha ** (1 / n), rel=1e-10)
    assert binomial_lower(0, n, confidence) == 0.0 and binomial_upper(n, n, confidence) == 1.0


@pytest.mark.parametrize(("k", "n", "low", "high"), [
    (5, 10, 0.187086, 0.812914),  # the two-sided 95% interval, each side at 97.5%
    (0, 10, 0.0, 0.308497),
    (1, 20, 0.001265, 0.248733),
])
def test_clopper_pearson_tabulated(k: int, n: int, low: float, high: float) -> None:
    assert binomial_lower(k, n, 0.975) == pytest.approx(low, abs=2e-6)
    assert binomial_upper(k, n, 0.975) == pytest.approx(high, abs=2e-6)


def test_the_bound_and_its_p_value_agree() -> None:
    for k, n in ((37, 40, ), (180, 200), (9, 10)):
        low = binomial_lower(k, n, 0.95)
        assert binomial_p(k, n, low, "at_least") == pytest.approx(0.05, rel=1e-9)
        assert binomial_p(k, n, low - 1e-6, "at_least") < 0.05 < binomial_p(k, n, low + 1e-6,
                                                                             "at_least")


@pytest.mark.parametrize("q", [0.6, 0.9, 0.975, 0.999])
def test_students_t_closed_forms_and_tables(q: float) -> None:
    assert t_cdf(t_quantile(q, 1), 1) == pytest.approx(q, abs=1e-12)
    assert t_quantile(q, 1) == pytest.approx(math.tan(math.pi * (q - 0.5)), rel=1e-9)  # Cauchy
    x = t_quantile(q, 2)
    assert 0.5 + x / (2 * math.sqrt(2 + x * x)) == pytest.approx(q, abs=1e-12)
    assert t_quantile(q, math.inf) == NormalDist().inv_cdf(q)
    assert t_quantile(1 - q, 7) == pytest.approx(-t_quantile(q, 7), rel=1e-12)


@pytest.mark.parametrize(("q", "df", "value"), [(0.95, 15, 1.753050), (0.975, 10, 2.228139),
                                                (0.99, 5, 3.364930), (0.95, 1000, 1.646379)])
def test_students_t_tabulated(q: float, df: float, value: float) -> None:
    assert t_quantile(q, df) == pytest.approx(value, abs=2e-6)


def test_location_p_is_the_level_at_which_the_bound_meets_the_threshold() -> None:
    se, df = 0.02, 15
    for confidence in (0.9, 0.95, 0.99):
        margin = t_quantile(confidence, df) * se  # the bound sits exactly on the threshold
        assert location_p(margin, se, df) == pytest.approx(1 - confidence, rel=1e-9)
    assert location_p(0.1, 0.0) == 0.0 and location_p(-0.1, 0.0) == 1.0
    assert location_p(0.0, 0.0) == 0.5


def test_holm_step_down_hand_worked() -> None:
    # sorted: 0.005 x 4 = 0.02, 0.01 x 3 = 0.03, 0.03 x 2 = 0.06, 0.04 x 1 -> max(0.06, 0.04)
    assert holm([0.01, 0.04, 0.03, 0.005]) == pytest.approx([0.03, 0.06, 0.06, 0.02])
    assert holm([0.02] * 5) == pytest.approx([0.1] * 5)  # equal p-values: Bonferroni
    assert holm([0.3, 0.9]) == pytest.approx([0.6, 0.9])
    assert holm([0.5, 0.6, 0.7]) == [1.0, 1.0, 1.0] and holm([]) == []


def test_examples_needed_closed_forms() -> None:
    # every example right: alpha ** (1 / N) >= t  <=>  N >= log(alpha) / log(t)
    for t in (0.8, 0.9, 0.95, 0.99):
        assert examples_for_binomial(1.0, t, "at_least", 0.95) == math.ceil(
            math.log(0.05) / math.log(t))
        assert examples_for_binomial(0.0, 1 - t, "at_most", 0.95) == math.ceil(
            math.log(0.05) / math.log(t))
    n = examples_for_binomial(0.95, 0.9, "at_least", 0.95)
    assert n is not None
    assert binomial_lower(round(0.95 * n), n, 0.95) >= 0.9
    assert binomial_lower(round(0.95 * (n - 1)), n - 1, 0.95) < 0.9
    assert examples_for_binomial(0.9, 0.9, "at_least", 0.95) is None
    # a difference of shares: the fewest N whose exact bound (the one certification reads)
    # reaches the threshold at the measured rates
    for r1, r2, t in ((0.4, 0.0, 0.3), (0.6, 0.05, 0.5)):
        n = examples_for_difference(r1, r2, t, 0.95)
        assert n is not None
        assert difference_lower(round(r1 * n), n, round(r2 * n), n, 0.95) >= t
        assert difference_lower(round(r1 * (n - 1)), n - 1, round(r2 * (n - 1)), n - 1,
                                0.95) < t
    assert examples_for_difference(0.35, 0.05, 0.3, 0.95) is None
    # se falls as 1/sqrt(N): margin = q se sqrt(n / N)
    assert examples_for_location(0.01, 0.02, 100, 1.645) == math.ceil(100 * (1.645 * 2) ** 2)
    assert examples_for_location(0.0, 0.02, 100, 1.645) is None


def test_beta_quantile_inverts_betainc() -> None:
    for a, b, q in ((0.5, 0.5, 0.1), (3, 200, 0.05), (950.5, 50.5, 0.95)):
        assert betainc(a, b, beta_quantile(q, a, b)) == pytest.approx(q, abs=1e-12)


@pytest.mark.parametrize(("k1", "n1", "k2", "n2", "threshold"), [
    (70, 200, 4, 200, 0.25), (30, 50, 0, 50, 0.3), (12.5, 80.0, 3.2, 95.5, 0.0),
    (5, 300, 40, 300, -0.2)])
def test_the_difference_bound_and_its_p_value_agree(k1: float, n1: float, k2: float,
                                                    n2: float, threshold: float) -> None:
    p = difference_p(k1, n1, k2, n2, threshold)
    assert 0 < p < 1
    assert difference_lower(k1, n1, k2, n2, 1 - p) == pytest.approx(threshold, abs=1e-9)
    for confidence in (0.9, 0.95, 0.99):  # past the threshold exactly when p <= alpha
        assert (difference_lower(k1, n1, k2, n2, confidence) >= threshold) == (
            p <= 1 - confidence)


def test_the_difference_bound_is_each_share_at_half_the_level() -> None:
    n = 120
    assert difference_lower(30, n, 0, n, 0.95) == pytest.approx(
        binomial_lower(30, n, 0.975) - (1 - 0.025 ** (1 / n)), abs=1e-12)
    assert difference_lower(n, n, 0, n, 0.9) == pytest.approx(
        0.05 ** (1 / n) - (1 - 0.05 ** (1 / n)), abs=1e-12)


def test_bootstrap_t_is_the_studentised_ratio_of_each_resample() -> None:
    """Against the statistic computed by hand for each resample of the same draws."""
    g = torch.Generator().manual_seed(5)
    n = 23
    num = torch.rand(2, n, generator=g, dtype=torch.float64)
    den = 1 + torch.randint(0, 4, (2, n), generator=g).double()
    t_star = bootstrap_t(num, den, resamples=40, seed=3)
    idx = torch.randint(0, n, (40, n), generator=torch.Generator().manual_seed(3))
    for row in range(2):
        ratio = float(num[row].sum() / den[row].sum())
        for b in range(40):
            x, w = num[row, idx[b]], den[row, idx[b]]
            expected = (float(x.sum() / w.sum()) - ratio) / ratio_stderr(x, w)
            assert float(t_star[row, b]) == pytest.approx(expected, rel=1e-9)


def test_bootstrap_t_counts_resamples_without_a_ratio_against_the_claim() -> None:
    """Denominators of both signs: a resample whose denominators sum to <= 0 has no ratio;
    it counts in the p-value of either side, and the quantiles treat it as the extreme."""
    num = torch.tensor([[1.0, 0.5, 0.2, 0.9]], dtype=torch.float64)
    den = torch.tensor([[1.0, -1.0, 0.5, 0.1]], dtype=torch.float64)
    t_star = bootstrap_t(num, den, resamples=BOOTSTRAP_T)
    bad = float(t_star.isnan().double().mean())
    assert 0 < bad < 1
    value, se = num.sum(1) / den.sum(1), torch.tensor([0.5], dtype=torch.float64)
    for side, sign in (("at_least", 1), ("at_most", -1)):
        _, p = bootstrap_t_side(value, se, t_star, -sign * 1e9, side, 0.95)
        beyond = float((t_star == sign * math.inf).double().mean())  # one example drawn n times
        assert float(p) == pytest.approx(bad + beyond)  # every finite t* on the claim's side


ALPHA = 0.05
DRAWS = 20_000


def _at_most_alpha(rate: float, draws: int) -> bool:
    """The rate of wrong certifications is at most alpha up to 3 Monte-Carlo standard errors."""
    return rate <= ALPHA + 3 * math.sqrt(ALPHA * (1 - ALPHA) / draws)


@pytest.mark.parametrize(("true", "n"), [(0.9, 80), (0.95, 300), (0.5, 31)])
def test_clopper_pearson_certifies_a_false_floor_at_most_alpha_of_the_time(true: float,
                                                                           n: int) -> None:
    """The floor sits on the true value (the hardest false claim): over many verification sets
    drawn from it, the bound clears the floor in at most 5% of them."""
    g = torch.Generator().manual_seed(0)
    k = (torch.rand(DRAWS, n, generator=g) < true).sum(1)  # (DRAWS,)
    certified = torch.tensor([binomial_lower(j, n, 1 - ALPHA) >= true for j in range(n + 1)])
    rate = float(certified[k].double().mean())
    assert _at_most_alpha(rate, DRAWS)
    # a bound that never clears would pass the line above: past the floor, it must clear
    better = (torch.rand(DRAWS, n, generator=g) < true + 0.6 * (1 - true)).sum(1)
    assert float(certified[better].double().mean()) > 0.5


def test_the_t_bound_on_grouped_means_certifies_a_false_cap_at_most_alpha() -> None:
    g = torch.Generator().manual_seed(1)
    groups = 16
    values = 0.3 + 0.05 * torch.randn(DRAWS, groups, generator=g)  # true mean 0.3 = the cap
    mean, se = values.mean(1), values.std(1) / math.sqrt(groups)
    q = t_quantile(1 - ALPHA, groups - 1)
    rate = float(((mean + q * se) <= 0.3).double().mean())
    assert _at_most_alpha(rate, DRAWS)


def test_holm_keeps_the_family_wise_error_at_most_alpha() -> None:
    """Five clauses, three of them on their floor (false), two well past it: the chance that
    Holm certifies any of the three at family-wise 95% is at most 5%."""
    g = torch.Generator().manual_seed(2)
    n, draws = 60, 4000
    truth = torch.tensor([0.9, 0.9, 0.9, 0.99, 0.995])
    floors = [0.9, 0.9, 0.9, 0.9, 0.9]
    k = (torch.rand(draws, 5, n, generator=g) < truth[None, :, None]).sum(-1)  # (draws, 5)
    p = {j: binomial_p(j, n, 0.9, "at_least") for j in range(n + 1)}
    wrong = 0
    for row in k.tolist():
        adjusted = holm([p[j] for j in row])
        wrong += any(a <= ALPHA for a, f, t in zip(adjusted, floors, truth.tolist(),
                                                   strict=True) if t <= f)
    assert _at_most_alpha(wrong / draws, draws)


@pytest.mark.parametrize("c", [-0.2, -0.03, 0.0, 0.05, 0.3])
def test_halls_transformation_closed_form_monotone_and_inverted(c: float) -> None:
    xs = [x / 4 for x in range(-20, 21)]
    for x in xs:  # g(x) = x + c (2 x^2 + 1) + 4/3 c^2 x^3
        assert skewed_t(x, c) == pytest.approx(x + c * (2 * x * x + 1) + 4 / 3 * c * c * x ** 3,
                                               abs=1e-12)
        assert skewed_t_inverse(skewed_t(x, c), c) == pytest.approx(x, abs=1e-9)
    values = [skewed_t(x, c) for x in xs]
    assert all(a <= b for a, b in zip(values, values[1:], strict=False))  # g' = (1 + 2cx)^2


def test_the_skew_term_and_its_absence() -> None:
    assert skew_term(1.2, 64) == pytest.approx(1.2 / (6 * 8))
    assert skew_term(None, 64) == skew_term(math.nan, 64) == skew_term(1.0, 2) == 0.0


@pytest.mark.parametrize("c", [-0.1, 0.0, 0.08])
def test_the_skewed_bound_and_its_p_value_agree(c: float) -> None:
    """A lower bound ``value - g^-1(q) se`` at level 1 - alpha lies on its threshold exactly
    when the p-value there is alpha; with c = 0 both are the Student-t ones."""
    value, se, df, alpha = 0.8, 0.02, 15.0, 0.05
    q = t_quantile(1 - alpha, df)
    bound = value - skewed_t_inverse(q, c) * se
    assert skewed_location_p(value - bound, se, df, c) == pytest.approx(alpha, abs=1e-9)
    if c == 0.0:
        assert bound == pytest.approx(value - q * se)
        assert skewed_location_p(0.03, se, df, c) == location_p(0.03, se, df)
    # A left-skewed mean (c < 0: a few sequences far below) is bounded further down.
    assert (bound < value - q * se) == (c < 0)


def _sample_skewness(num: torch.Tensor, den: torch.Tensor) -> float:
    u = num - num.sum() / den.sum() * den  # mean 0
    return float((u ** 3).mean() / (u ** 2).mean() ** 1.5)


def test_ratio_skewness_is_the_jackknifed_skewness_of_the_linearised_values() -> None:
    """``n g - (n - 1) mean_i g_(i)``, each ``g_(i)`` recomputed from scratch with unit ``i``
    left out (its ratio too): the closed form the library evaluates from power sums."""
    num = torch.tensor([1.0, 4.0, 2.0, 9.0, 3.0], dtype=torch.float64)
    den = torch.tensor([1.0, 2.0, 1.0, 3.0, 2.0], dtype=torch.float64)
    n = num.numel()
    left_out = [_sample_skewness(torch.cat([num[:i], num[i + 1:]]),
                                 torch.cat([den[:i], den[i + 1:]])) for i in range(n)]
    expected = n * _sample_skewness(num, den) - (n - 1) * sum(left_out) / n
    assert ratio_skewness(num, den) == pytest.approx(expected, abs=1e-12)
    three = (num[:3], den[:3])  # too few units to leave one out: the sample skewness
    assert ratio_skewness(*three) == pytest.approx(_sample_skewness(*three), abs=1e-12)
    assert math.isnan(ratio_skewness(num[:2], den[:2]))  # fewer than three units
    assert math.isnan(ratio_skewness(2 * den, den))  # no spread
    flat = torch.tensor([1.0, 1.0, 1.0, 5.0], dtype=torch.float64)  # a unit's absence: no spread
    ones = torch.ones(4, dtype=torch.float64)
    assert ratio_skewness(flat, ones) == pytest.approx(_sample_skewness(flat, ones), abs=1e-12)


def test_jackknifed_skewness_is_nearer_a_known_skewness() -> None:
    """Exponential values have skewness exactly 2. Over 4000 samples of 64 the sample
    skewness averages 1.69 (biased low); the jackknife removes most of that bias (measured:
    1.91), at least half of it here."""
    g = torch.Generator().manual_seed(40)
    x = -torch.rand(4000, 64, generator=g, dtype=torch.float64).log()  # Exp(1)
    ones = torch.ones(64, dtype=torch.float64)
    plain = sum(_sample_skewness(row, ones) for row in x) / len(x)
    jack = sum(ratio_skewness(row, ones) for row in x) / len(x)
    assert plain < jack < 2.0 + (2.0 - plain)
    assert abs(jack - 2.0) < 0.5 * abs(plain - 2.0)


