"""One-sided confidence bounds for verdicts: exact binomial (Clopper-Pearson), normal and
Student-t bounds, the p-values consistent with them, Holm's step-down and the sample size a
bound needs.

Everything reduces to the regularised incomplete beta function
``I_x(a, b) = B(x; a, b) / B(a, b)``, evaluated by its continued fraction (modified Lentz), and
its inverse by bisection; no statistics library is needed.

For a bound at confidence ``c`` (``alpha = 1 - c``):

- binomial, ``k`` successes of ``n``: the lower bound is the ``alpha`` quantile of
  ``Beta(k, n - k + 1)`` (0 when ``k = 0``), the upper bound the ``1 - alpha`` quantile of
  ``Beta(k + 1, n - k)`` (1 when ``k = n``); ``P(Bin(n, p) >= k) = I_p(k, n - k + 1)``, so the
  lower bound is the ``p`` at which seeing ``k`` or more has chance ``alpha``;
- normal / Student-t, a value ``v`` with standard error ``s``: ``v -+ q s`` with ``q`` the
  ``c`` quantile of ``N(0, 1)`` or of ``t`` with ``df`` degrees of freedom.

The p-value of H0 "the true value is on the wrong side of threshold ``t``" is the ``alpha`` at
which the bound reaches ``t``: a bound at confidence ``c`` is past ``t`` exactly when that
p-value is at most ``1 - c``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from statistics import NormalDist

DEFAULT_CONFIDENCE = 0.95
"""A contract's default level (``contract.confidence``)."""
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
    margin)^2)`` (``None`` without a positive margin and standard error, or a finite
    quantile)."""
    if not (margin > 0 and stderr > 0 and n > 0 and math.isfinite(quantile)):
        return None
    return max(n, math.ceil(n * (quantile * stderr / margin) ** 2))


def examples_for_binomial(rate: float, threshold: float, side: str, confidence: float,
                          limit: int = 1 << 40) -> int | None:
    """The fewest examples ``N`` at which ``round(rate N)`` successes give a Clopper-Pearson
    bound past ``threshold`` (``side``: ``at_least`` or ``at_most``); ``None`` when ``rate`` is
    not past the threshold or more than ``limit`` would be needed. Binary search: the bound at a
    fixed rate tightens as ``N`` grows (up to the rounding of ``rate N``)."""
    if side == "at_most":
        return examples_for_binomial(1.0 - rate, 1.0 - threshold, "at_least", confidence, limit)
    if rate <= threshold:
        return None

    def clears(n: int) -> bool:  # the bound is past the threshold <=> its p-value <= alpha
        return binomial_p(round(rate * n), n, threshold, "at_least") <= 1.0 - confidence

    lo, hi = 1, 1
    while not clears(hi):
        lo, hi = hi + 1, hi * 2
        if hi > limit:
            return None
    while lo < hi:
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if clears(mid) else (mid + 1, hi)
    return hi
