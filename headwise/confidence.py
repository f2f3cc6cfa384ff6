"""One-sided confidence bounds for verdicts: exact binomial (Clopper-Pearson) on a share and on
a difference of two shares, normal and Student-t bounds, the studentised bootstrap of a ratio,
the p-values consistent with them, Holm's step-down and the sample size a bound needs.

Everything reduces to the regularised incomplete beta function
``I_x(a, b) = B(x; a, b) / B(a, b)``, evaluated by its continued fraction (modified Lentz), and
its inverse by bisection; no statistics library is needed.

For a bound at confidence ``c`` (``alpha = 1 - c``):

- binomial, ``k`` successes of ``n``: the lower bound is the ``alpha`` quantile of
  ``Beta(k, n - k + 1)`` (0 when ``k = 0``), the upper bound the ``1 - alpha`` quantile of
  ``Beta(k + 1, n - k)`` (1 when ``k = n``); ``P(Bin(n, p) >= k) = I_p(k, n - k + 1)``, so the
  lower bound is the ``p`` at which seeing ``k`` or more has chance ``alpha``;
- normal / Student-t, a value ``v`` with standard error ``s``: ``v -+ q s`` with ``q`` the
  ``c`` quantile of ``N(0, 1)`` or of ``t`` with ``df`` degrees of freedom; for a mean of
  ``n`` units with skewness ``gamma``, ``q`` moved by Hall's (1992) transformation
  (``skewed_t``), which removes the ``gamma / sqrt(n)`` error a symmetric bound makes on a
  skewed mean (a mean of values near 1 with a few far below certified a false floor in 8% of
  simulated probes at 5%);

- a difference of two shares ``p1 - p2`` (a drop: the share of examples an ablation harms less
  the share it helps): the lower bound ``L1 - U2``, each a Clopper-Pearson bound at ``1 -
  alpha / 2`` (the chance that either misses is at most ``alpha``, whatever the dependence
  between the two counts: a union bound, so conservative, never approximate);
- the studentised bootstrap (bootstrap-t) of a ratio ``R = sum(num) / sum(den)`` over
  examples: ``t* = (R* - R) / se*`` over resamples of the examples, ``se`` the linearised
  standard error; the bound is ``R - q* se``, ``q*`` a quantile of ``t*`` (second-order
  accurate where a normal bound on a skewed or rare-event statistic is not; Efron and
  Tibshirani 1993, ch. 12 and 14).

The p-value of H0 "the true value is on the wrong side of threshold ``t``" is the ``alpha`` at
which the bound reaches ``t``: a bound at confidence ``c`` is past ``t`` exactly when that
p-value is at most ``1 - c``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from statistics import NormalDist

import torch
from torch import Tensor

DEFAULT_CONFIDENCE = 0.95
"""A contract's default level (``contract.confidence``)."""
BOOTSTRAP_T = 1000
"""Resamples of the studentised bootstrap."""
_EPS = 1e-15
_TINY = 1e-300


def betainc(a: float, b: float, x: float) -> float:
    """The regularised incomplete beta function ``I_x(a, b)`` for ``a, b > 0``.

    The continued fraction converges fast for ``x < (a + 1) / (a + b + 2)``; above it the
    symmetry ``I_x(a, b) = 1 - I_{1-x}(b, a)`` is used.

    Raises:
        ValueError: ``a`` or ``b`` not positive.
    """
    if not (a > 0 and b > 0):
        raise ValueError(f"betainc: got a={a}, b={b}, expected both > 0")
    if x <= 0.0:
        return 0.0
    if x >= 1.0:
        return 1.0
    if x > (a + 1.0) / (a + b + 2.0):
        return 1.0 - betainc(b, a, 1.0 - x)
    log_front = (a * math.log(x) + b * math.log1p(-x)
                 - (math.lgamma(a) + math.lgamma(b) - math.lgamma(a + b)))
    return math.exp(log_front) * _fraction(a, b, x) / a


def _fraction(a: float, b: float, x: float) -> float:
    """The continued fraction of ``I_x(a, b)`` (Numerical Recipes' ``betacf``, modified Lentz)."""
    def tiny(v: float) -> float:
        return v if abs(v) > _TINY else _TINY

    c, d = 1.0, 1.0 / tiny(1.0 - (a + b) * x / (a + 1.0))
    h = d
    for m in range(1, 10_000 + int(10 * math.sqrt(max(a, b)))):
        even = m * (b - m) * x / ((a - 1.0 + 2 * m) * (a + 2 * m))
        d, c = 1.0 / tiny(1.0 + even * d), tiny(1.0 + even / c)
        h *= d * c
        odd = -(a + m) * (a + b + m) * x / ((a + 2 * m) * (a + 1.0 + 2 * m))
        d, c = 1.0 / tiny(1.0 + odd * d), tiny(1.0 + odd / c)
        h *= d * c
        if abs(d * c - 1.0) < _EPS:
            break
    return h


def beta_quantile(q: float, a: float, b: float) -> float:
    """The ``x`` with ``I_x(a, b) = q`` (bisection to 2e-16; ``I_x`` increases in ``x``)."""
    if q <= 0.0:
        return 0.0
    if q >= 1.0:
        return 1.0
    lo, hi = 0.0, 1.0
    for _ in range(52):  # 2 ** -52 ~ 2e-16
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if betainc(a, b, mid) < q else (lo, mid)
    return (lo + hi) / 2


def binomial_lower(k: float, n: float, confidence: float) -> float:
    """Clopper-Pearson one-sided lower bound on a proportion from ``k`` of ``n`` at
    ``confidence``: ``Beta(k, n - k + 1)``'s ``1 - confidence`` quantile (0 when ``k = 0``;
    ``(1 - confidence) ** (1 / n)`` when ``k = n``). ``k`` and ``n`` may be fractional (an
    effective sample size)."""
    if k <= 0:
        return 0.0
    return beta_quantile(1.0 - confidence, k, n - k + 1.0)


def binomial_upper(k: float, n: float, confidence: float) -> float:
    """Clopper-Pearson one-sided upper bound: ``1 - binomial_lower(n - k, n)``."""
    return 1.0 - binomial_lower(n - k, n, confidence)


def binomial_p(k: float, n: float, threshold: float, side: str) -> float:
    """Exact binomial p-value of H0 "the proportion is on the wrong side of ``threshold``":
    ``side="at_least"`` (H0: ``p < threshold``): ``P(X >= k | threshold) = I_t(k, n - k + 1)``;
    ``side="at_most"`` (H0: ``p > threshold``): ``P(X <= k | threshold)``."""
    if side == "at_most":
        return binomial_p(n - k, n, 1.0 - threshold, "at_least")
    if k <= 0:
        return 1.0
    return betainc(k, n - k + 1.0, threshold)


def difference_lower(k1: float, n1: float, k2: float, n2: float, confidence: float) -> float:
    """Lower bound on ``p1 - p2`` from ``k1`` of ``n1`` and ``k2`` of ``n2`` (the counts may come
    from the same examples): ``binomial_lower(k1, n1) - binomial_upper(k2, n2)``, each at
    ``1 - alpha / 2``. Both hold together with chance at least ``1 - alpha`` (Bonferroni), so
    the difference bound does too, exactly or conservatively."""
    half = 1.0 - (1.0 - confidence) / 2.0
    return binomial_lower(k1, n1, half) - binomial_upper(k2, n2, half)


def difference_p(k1: float, n1: float, k2: float, n2: float, threshold: float) -> float:
    """p-value of H0 "``p1 - p2 < threshold``" consistent with ``difference_lower``: the
    smallest ``alpha`` at which that bound reaches ``threshold``,
    ``min(1, 2 min_x max(P(X1 >= k1 | threshold + x), P(X2 <= k2 | x)))`` over the split
    ``x`` (``U2 <= x`` and ``L1 >= threshold + x``). The first term increases in ``x`` and the
    second decreases, so the minimum of their maximum is where they cross (bisection)."""
    lo, hi = max(0.0, -threshold), min(1.0, 1.0 - threshold)
    if lo > hi:
        return 1.0

    def first(x: float) -> float:
        return binomial_p(k1, n1, min(1.0, threshold + x), "at_least")

    def second(x: float) -> float:
        return binomial_p(k2, n2, x, "at_most")

    if first(lo) >= second(lo):
        best = first(lo)
    elif first(hi) <= second(hi):
        best = second(hi)
    else:
        for _ in range(52):
            mid = (lo + hi) / 2
            lo, hi = (mid, hi) if first(mid) < second(mid) else (lo, mid)
        best = first(hi)
    return min(1.0, 2.0 * best)


def t_cdf(x: float, df: float) -> float:
    """Student-t CDF with ``df`` degrees of freedom (``math.inf``: the normal):
    ``1 - I_{df / (df + x^2)}(df / 2, 1 / 2) / 2`` for ``x >= 0``, symmetric below."""
    if math.isinf(df):
        return NormalDist().cdf(x)
    if math.isinf(x):
        return 1.0 if x > 0 else 0.0
    tail = 0.5 * betainc(df / 2.0, 0.5, df / (df + x * x))
    return 1.0 - tail if x >= 0 else tail


def t_quantile(q: float, df: float) -> float:
    """The ``q`` quantile of Student's t (``df = math.inf``: the normal)."""
    if math.isinf(df):
        return NormalDist().inv_cdf(q)
    if q == 0.5:
        return 0.0
    y = beta_quantile(2.0 * min(q, 1.0 - q), df / 2.0, 0.5)  # 2 P(T > |x|) = I_y(df/2, 1/2)
    x = math.sqrt(df * (1.0 / y - 1.0)) if y > 0 else math.inf
    return x if q > 0.5 else -x


def location_p(margin: float, stderr: float, df: float = math.inf) -> float:
    """p-value of H0 "the true value is on the wrong side of its threshold" for a value
    ``margin`` past it (``> 0``: on the right side) with standard error ``stderr``:
    ``1 - F(margin / stderr)``, ``F`` the normal or t CDF. A zero standard error gives 0
    past the threshold, 1 short of it and 1/2 on it."""
    if stderr > 0:
        return 1.0 - t_cdf(margin / stderr, df)
    return 0.0 if margin > 0 else 1.0 if margin < 0 else 0.5


def skew_term(skew: float | None, units: int) -> float:
    """Hall's skewness term ``c = gamma / (6 sqrt(n))`` of a studentised mean of ``n`` units
    whose values have skewness ``gamma`` (0 where it is unknown): the first-order error of a
    symmetric t bound on a skewed mean (``skewed_t``)."""
    if skew is None or not math.isfinite(skew) or units < 3:
        return 0.0
    return skew / (6.0 * math.sqrt(units))


def skewed_t(x: float, c: float) -> float:
    """Hall's (1992) monotone transformation ``g(x) = x + c (2 x^2 + 1) + 4/3 c^2 x^3`` of a
    studentised mean ``T``: its Edgeworth expansion ``P(T <= x) = Phi(x + c (2 x^2 + 1)) +
    O(1/n)`` makes ``g(T)`` symmetric to second order, and the cubic term keeps ``g``
    increasing (``g'(x) = (1 + 2 c x)^2``). ``c = 0``: the identity."""
    if c == 0.0:
        return x
    return ((1.0 + 2.0 * c * x) ** 3 - 1.0) / (6.0 * c) + c


def skewed_t_inverse(y: float, c: float) -> float:
    """The ``x`` with ``skewed_t(x, c) = y``."""
    if c == 0.0:
        return y
    w = 6.0 * c * (y - c) + 1.0
    return (math.copysign(abs(w) ** (1.0 / 3.0), w) - 1.0) / (2.0 * c)


def skewed_location_p(margin: float, stderr: float, df: float, c: float) -> float:
    """``location_p`` of a studentised mean with skewness term ``c`` (``skew_term``), for a
    value ``margin`` past a lower bound's threshold; for an upper bound's, pass ``-c``
    (mirroring the value mirrors its skewness). ``c = 0``: ``location_p``."""
    if c == 0.0 or not stderr > 0:
        return location_p(margin, stderr, df)
    return 1.0 - t_cdf(skewed_t(margin / stderr, c), df)


def holm(pvalues: Sequence[float]) -> list[float]:
    """Holm's step-down adjusted p-values, in the input order: with ``p_(1) <= ... <= p_(m)``,
    ``adj_(i) = max_{j <= i} min(1, (m - j + 1) p_(j))``. Rejecting every hypothesis whose
    adjusted p-value is at most ``alpha`` keeps the family-wise error rate (the chance of
    rejecting any true null) at most ``alpha``, whatever the dependence between the tests."""
    m = len(pvalues)
    order = sorted(range(m), key=lambda i: pvalues[i])
    out = [1.0] * m
    running = 0.0
    for rank, i in enumerate(order):
        running = max(running, min(1.0, (m - rank) * pvalues[i]))
        out[i] = running
    return out


def examples_for_location(margin: float, stderr: float, n: int, quantile: float) -> int | None:
    """Examples a normal or t bound needs to clear its threshold at the measured ``margin`` and
    spread: the standard error falls as ``1 / sqrt(N)``, so ``N = ceil(n (quantile stderr /
    margin)^2)`` (fewer than ``n`` for a bound already past it; ``None`` without a positive
    margin and standard error, or a finite quantile)."""
    if not (margin > 0 and stderr > 0 and n > 0 and math.isfinite(quantile)):
        return None
    return max(1, math.ceil(n * (quantile * stderr / margin) ** 2))


def examples_for_binomial(rate: float, threshold: float, side: str, confidence: float,
                          limit: int = 1 << 40) -> int | None:
    """The fewest examples ``N`` at which ``round(rate N)`` successes give a Clopper-Pearson
    bound past ``threshold`` (``side``: ``at_least`` or ``at_most``); ``None`` when ``rate`` is
    not past the threshold or more than ``limit`` would be needed."""
    if side == "at_most":
        return examples_for_binomial(1.0 - rate, 1.0 - threshold, "at_least", confidence, limit)
    if rate <= threshold:
        return None
    return fewest(lambda n: binomial_p(round(rate * n), n, threshold, "at_least")
                  <= 1.0 - confidence, limit)


def examples_for_difference(rate1: float, rate2: float, threshold: float, confidence: float,
                            limit: int = 1 << 40) -> int | None:
    """The fewest examples ``N`` at which ``round(rate1 N)`` and ``round(rate2 N)`` successes
    give a ``difference_lower`` bound at ``threshold`` or past it (the bound certification
    reads); ``None`` when ``rate1 - rate2`` is not past the threshold or more than ``limit``
    would be needed."""
    if not rate1 - rate2 > threshold:
        return None
    return fewest(lambda n: difference_lower(round(rate1 * n), n, round(rate2 * n), n,
                                             confidence) >= threshold, limit)


def share_examples_if_perfect(side: str, threshold: float, level: float,
                              limit: int = 1 << 40) -> int | None:
    """The fewest examples at which a share measured at its best (every example on the
    favourable side: ``n`` of ``n`` for ``at_least``, none for ``at_most``) is certified at
    p-value ``level``: the smallest ``N`` with ``threshold ** N <= level`` (or ``(1 -
    threshold) ** N``), found on ``binomial_p`` as certification computes it; ``None`` when no
    share can clear the threshold (``at_least 1``, ``at_most 0``)."""
    if side == "at_most":
        return share_examples_if_perfect("at_least", 1.0 - threshold, level, limit)
    if threshold >= 1.0:
        return None
    return fewest(lambda n: binomial_p(n, n, max(threshold, 0.0), "at_least") <= level, limit)


def difference_examples_if_perfect(threshold: float, level: float,
                                   limit: int = 1 << 40) -> int | None:
    """The fewest examples at which a difference of shares measured at its best (every
    example in the first share, none in the second) is certified at p-value ``level``
    (``difference_p``); ``None`` when no difference can clear ``threshold`` (``>= 1``)."""
    if threshold >= 1.0:
        return None
    return fewest(lambda n: difference_p(n, n, 0, n, threshold) <= level, limit)


def fewest(clears: Callable[[int], bool], limit: int = 1 << 40) -> int | None:
    """The smallest ``N >= 1`` with ``clears(N)``, for a ``clears`` that stays true once true
    (a bound at fixed rates tightens as ``N`` grows, up to rounding): doubling, then
    bisection; ``None`` past ``limit``."""
    lo, hi = 1, 1
    while not clears(hi):
        lo, hi = hi + 1, hi * 2
        if hi > limit:
            return None
    while lo < hi:
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if clears(mid) else (mid + 1, hi)
    return hi


def bootstrap_t(num: Tensor, den: Tensor, resamples: int = BOOTSTRAP_T,
                seed: int = 0) -> Tensor:
    """The studentised bootstrap statistics ``t* = (R* - R) / se*`` of the ratio ``R =
    sum(num) / sum(den)``, each row of ``num`` / ``den`` its own sample of ``n`` examples
    resampled with replacement (the same draws for every row), ``se`` the linearised standard
    error ``sqrt(n / (n - 1) sum (num - R den)^2) / sum(den)``.

    A resample is the count of times each example is drawn, so every sum over it is one
    matrix product. A resample without spread gives ``t* = 0`` on the estimate and ``-+inf``
    off it; one whose ``sum(den*) <= 0`` (a ratio that does not exist) gives NaN, which
    ``bootstrap_t_side`` counts against the claim.

    Args:
        num, den: (D, n) float64, ``n >= 2``.  resamples: how many.  seed: of the draws.

    Returns:
        (D, resamples).
    """
    n = num.shape[1]
    gen = torch.Generator().manual_seed(seed)
    idx = torch.randint(0, n, (resamples, n), generator=gen)
    counts = torch.zeros(resamples, n, dtype=num.dtype).scatter_add_(
        1, idx, torch.ones(resamples, n, dtype=num.dtype))  # (B, n) draws of each example
    r = num.sum(1) / den.sum(1)  # (D,)
    sx, sw = num @ counts.T, den @ counts.T  # (D, B)
    rs = sx / sw
    spread = ((num * num) @ counts.T - 2 * rs * ((num * den) @ counts.T)
              + rs * rs * ((den * den) @ counts.T)).clamp_min(0)
    s = (spread * n / (n - 1)).sqrt() / sw
    diff = rs - r[:, None]
    t = torch.where(s > 1e-12 * rs.abs().clamp_min(1.0), diff / s,
                    torch.where(diff.abs() <= 1e-12 * rs.abs().clamp_min(1.0), 0.0,
                                diff.sign() * math.inf))
    return torch.where(sw > 0, t, math.nan)


def bootstrap_t_side(value: Tensor, se: Tensor, t_star: Tensor, threshold: float, side: str,
                     confidence: float) -> tuple[Tensor, Tensor]:
    """The bootstrap-t bound on ``side`` (``at_least``: the lower bound ``value - q_{1 -
    alpha} se``; ``at_most``: the upper ``value - q_alpha se``, ``q`` the quantiles of ``t*``)
    and the p-value of H0 "the truth is on the wrong side of ``threshold``":
    ``P*(t* >= (value - threshold) / se)`` (``at_least``) or ``P*(t* <= ...)``. A NaN ``t*``
    counts as past every quantile, against the claim.

    Args:
        value, se: (D,).  t_star: (D, B) from ``bootstrap_t``.

    Returns:
        ``(bound (D,), p (D,))``.
    """
    B = t_star.shape[1]
    k = min(B - 1, int((1.0 - confidence) * B))
    z = ((value - threshold) / se)[:, None]
    bad = t_star.isnan()
    if side == "at_least":
        q = t_star.nan_to_num(math.inf, math.inf, -math.inf).sort(1).values[:, B - 1 - k]
        return value - q * se, ((t_star >= z) | bad).double().mean(1)
    q = t_star.nan_to_num(-math.inf, math.inf, -math.inf).sort(1).values[:, k]
    return value - q * se, ((t_star <= z) | bad).double().mean(1)
