"""One predictive distribution of a clause's final value that agrees with its verdict forecast.

A clause forecaster has two models: a calibrated classifier of the verdict (the probability
``p`` that the clause holds) and a regression of the final value with an interval. Read apart,
they can disagree (``p`` 0.82 beside a value that fails the bound). Here they make one
distribution: the regression's value is read as a normal ``N(mu, sigma)`` (``sigma`` such that
its central ``coverage`` interval is the regression's interval), and the final value is

    F = p * N(mu, sigma) | holds  +  (1 - p) * N(mu, sigma) | fails

(the law of total probability, with the verdict's probability from the calibrated model and
where the value lands, given the verdict, from the regression), then clipped to the range the
value can take. ``F`` puts exactly ``p`` on the values that hold, so its median holds exactly
when ``p >= 1/2`` (one-sided bounds; for a two-sided bound whose median lands inside it while
``p < 1/2``, the median of the failing part is taken instead), and its quantiles give the
interval. The probability is the calibrated model's, unchanged.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from statistics import NormalDist

_N = NormalDist()


@dataclass(frozen=True)
class _Piece:
    """An interval ``[lo, hi]`` of the value line (ends may be infinite) and its weight in F."""

    lo: float
    hi: float
    weight: float


def _mass(lo: float, hi: float, mu: float, sigma: float) -> float:
    """``P(lo <= X <= hi)`` for ``X ~ N(mu, sigma)``, from the nearer tail (no cancellation)."""
    a, b = (lo - mu) / sigma, (hi - mu) / sigma
    if a > 0:
        return _N.cdf(-a) - _N.cdf(-b)
    if b < 0:
        return _N.cdf(b) - _N.cdf(a)
    return 1.0 - _N.cdf(a) - _N.cdf(-b)


def _quantile(lo: float, hi: float, mu: float, sigma: float, r: float) -> float:
    """The ``r`` quantile of ``N(mu, sigma)`` restricted to ``[lo, hi]``. Where the interval
    lies so far in a tail that its mass underflows, the normal's tail there is an exponential
    of rate ``|a| / sigma`` from the nearer end (``a``: that end in standard units)."""
    r = min(max(r, 1e-12), 1.0 - 1e-12)
    a, b = (lo - mu) / sigma, (hi - mu) / sigma
    if a > 0:  # above mu: read survival functions
        sa, sb = _N.cdf(-a), _N.cdf(-b)
        if sa <= 0.0:
            return min(lo - sigma / a * math.log1p(-r), hi)
        return mu - sigma * _N.inv_cdf(min(max(sa - r * (sa - sb), 1e-300), 1.0 - 1e-16))
    if b < 0:  # below mu
        ca, cb = _N.cdf(a), _N.cdf(b)
        if cb <= 0.0:
            return max(hi - sigma / b * math.log(r), lo)
        return mu + sigma * _N.inv_cdf(min(max(ca + r * (cb - ca), 1e-300), 1.0 - 1e-16))
    ca, cb = _N.cdf(a), _N.cdf(b)
    return mu + sigma * _N.inv_cdf(min(max(ca + r * (cb - ca), 1e-300), 1.0 - 1e-16))


@dataclass(frozen=True)
class VerdictMixture:
    """``F`` of the module docstring.

    Args:
        probability: the calibrated probability that the clause holds.
        mu: the regression's final value, before clipping to the range.
        sigma: its standard deviation (> 0).
        at_least: the clause's floor (``None``: none).
        at_most: its cap (``None``: none).
        low: the least value the measurement can take (``-inf``: unbounded).
        high: the largest (``inf``: unbounded).
    """

    probability: float
    mu: float
    sigma: float
    at_least: float | None
    at_most: float | None
    low: float
    high: float

    def holding(self) -> tuple[float, float] | None:
        """The values that hold, on the unclipped line: a bound at or past an end of the range
        reaches to infinity there, so that clipping keeps a value's side (``None``: no value
        in the range holds)."""
        a = -math.inf if self.at_least is None or self.at_least <= self.low else self.at_least
        b = math.inf if self.at_most is None or self.at_most >= self.high else self.at_most
        return None if a > b or a > self.high or b < self.low else (a, b)

    def pieces(self) -> list[_Piece]:
        """F's parts in order along the line: failing below, holding, failing above; the
        failing weight split between the two by the normal's mass on each."""
        held = self.holding()
        if held is None:
            return [_Piece(-math.inf, math.inf, 1.0)]
        a, b = held
        p = self.effective_probability()
        below = _mass(-math.inf, a, self.mu, self.sigma) if a > -math.inf else 0.0
        above = _mass(b, math.inf, self.mu, self.sigma) if b < math.inf else 0.0
        if below + above <= 0.0:  # both underflow: the nearer side takes it
            below, above = (1.0, 0.0) if (a > -math.inf and (b == math.inf or
                                          self.mu - a < b - self.mu)) else (0.0, 1.0)
        out = [_Piece(-math.inf, a, (1 - p) * below / (below + above)),
               _Piece(a, b, p), _Piece(b, math.inf, (1 - p) * above / (below + above))]
        return [piece for piece in out if piece.weight > 0.0]

    def effective_probability(self) -> float:
        """The probability F puts on holding: ``probability``, except 1 where every value in
        the range holds and 0 where none does."""
        held = self.holding()
        if held is None:
            return 0.0
        return 1.0 if held == (-math.inf, math.inf) else self.probability

    def quantile(self, q: float, pieces: list[_Piece] | None = None) -> float:
        """F's ``q`` quantile, clipped to the range (of ``pieces``, renormalised: default all)."""
        parts = self.pieces() if pieces is None else pieces
        total = sum(p.weight for p in parts)
        target, seen, i = q * total, 0.0, 0
        while i < len(parts) - 1 and seen + parts[i].weight <= target:
            seen += parts[i].weight
            i += 1
        piece = parts[i]
        x = _quantile(piece.lo, piece.hi, self.mu, self.sigma, (target - seen) / piece.weight)
        return min(max(x, self.low), self.high)

    def median(self) -> float:
        """F's median, on the side of the bound the probability says (module docstring)."""
        value = self.quantile(0.5)
        holds = self.effective_probability() >= 0.5
        held = self.holding()
        inside = held is not None and held[0] <= value <= held[1]
        if inside == holds:
            return value
        return self.quantile(0.5, [p for p in self.pieces() if ((p.lo, p.hi) == held) == holds])
