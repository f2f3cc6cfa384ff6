"""Each clause's one-sided confidence bound at the contract's level, and the test it inverts.

Which bound a clause gets follows from what its measured value is (``Bound.method``):

- a task clause's ``exact`` metric, and its ``accuracy`` when every example scores one position,
  is a share of ``n`` independent examples: the exact binomial (Clopper-Pearson) bound on
  ``k = round(value n)`` of ``n``;
- a task clause's token ``accuracy`` over several positions per example is a clustered
  proportion (an example's tokens are not independent): Clopper-Pearson at the Korn-Graubard
  effective sample size ``n* = p (1 - p) / se^2`` (at most the number of scored positions; the
  number of examples when ``p`` is 0 or 1 or the standard error is 0, a bound on the share of
  examples right throughout, which the token accuracy is at least when examples score equally
  many positions), ``se`` the bootstrap standard error over examples;
- a task loss and an ablation drop: the normal bound ``value -+ z se`` on the bootstrap standard
  error over examples (a mean, or a paired difference of means, over independent examples, for
  which the central limit theorem holds at the sizes of a verification set);
- a role score and a ``preserve`` distance: the Student-t bound ``value -+ t_{G-1} se`` on the
  grouped ratio estimator's standard error over ``G`` (at most 16) groups of sequences;
- an exclusive clause and a ``role_drift`` clause carry no standard error: no bound, and they
  are never certified.

A clause bounded on both sides needs both bounds past their thresholds (an intersection-union
test: its p-value is the larger side's). An ``all_of`` clause is decided by its worst head and an
``any_of`` clause by its best; with ``m`` heads an ``any_of`` bound is at level ``1 - (1 - c) /
m`` (Bonferroni: which head decides is chosen on the same data). Only the deciding head's
standard error is measured, and every head's is taken to be that one.
"""

from __future__ import annotations

import math
from collections.abc import Callable

from headwise.analysis.importance_matrix import STDERR_GROUPS
from headwise.confidence import (
    binomial_lower,
    binomial_p,
    binomial_upper,
    examples_for_binomial,
    examples_for_location,
    location_p,
    t_quantile,
)
from headwise.contract.clause import Clause
from headwise.contract.kinds import KINDS
from headwise.contract.results import Bound, ClauseResult, VerifyData
from headwise.data import IGNORE

_SIDES = ("at_least", "at_most")


def certify(result: ClauseResult, data: VerifyData, confidence: float) -> Bound:
    """The bound of ``result``'s clause at ``confidence``, measured on ``data``."""
    c = result.clause
    if result.measured is None or math.isnan(result.measured):
        return Bound("none", confidence, note="nothing was measured")
    return _BY_KIND[c.kind](result, data, confidence)


def _task(result: ClauseResult, data: VerifyData, confidence: float) -> Bound:
    c = result.clause
    targets = data.batch(c.task or "", c.path).targets
    positions = (targets != IGNORE).sum(1)  # (B,)
    n = int(positions.shape[0])
    if c.metric == "loss":
        return _location(result, confidence, math.inf, n, "normal",
                         "bootstrap standard error over examples")
    value = float(result.measured or 0.0)
    if c.metric == "exact" or bool((positions == 1).all()):
        return _binomial(result, confidence, round(value * n), n, n, "clopper-pearson",
                         f"{round(value * n)} of {n} examples")
    se = result.stderr
    if se is None or not se > 0 or value in (0.0, 1.0):
        n_eff = float(n)
    else:
        n_eff = min(float(positions.sum()), value * (1.0 - value) / se ** 2)
    return _binomial(result, confidence, value * n_eff, n_eff, n,
                     "clopper-pearson (effective n)",
                     f"effective sample size {n_eff:.1f} from {n} examples of "
                     f"{int(positions.sum())} positions")


def _ablation(result: ClauseResult, data: VerifyData, confidence: float) -> Bound:
    c = result.clause
    n = int(data.batch(c.task or "", c.path).tokens.shape[0])
    return _location(result, confidence, math.inf, n, "normal",
                     "paired bootstrap standard error over examples")


def _grouped(result: ClauseResult, data: VerifyData, confidence: float) -> Bound:
    c = result.clause
    if c.kind != "score" and c.on is not None and c.on in data.tasks:
        n = int(data.tasks[c.on].tokens.shape[0])
    else:
        n = int(data.probe(data.probe_name(c.on, c.path), c.path)[0].shape[0])
    groups = min(STDERR_GROUPS, n)
    if groups < 2:
        return Bound("none", confidence, examples=n, note="fewer than two sequences")
    return _location(result, confidence, groups - 1.0, n, "student-t",
                     f"grouped ratio standard error over {groups} groups of sequences")


def _unbounded(result: ClauseResult, data: VerifyData, confidence: float) -> Bound:
    return Bound("none", confidence,
                 note=f"no standard error is estimated for a {result.clause.kind} clause")


def _preserve(result: ClauseResult, data: VerifyData, confidence: float) -> Bound:
    if result.clause.metric == "role_drift":
        return _unbounded(result, data, confidence)
    return _grouped(result, data, confidence)


_BY_KIND: dict[str, Callable[[ClauseResult, VerifyData, float], Bound]] = {
    "task": _task, "ablation": _ablation, "score": _grouped, "preserve": _preserve,
    "exclusive": _unbounded}


def _heads(c: Clause) -> int:
    """How many heads an ``any_of`` clause chose among (its Bonferroni factor), else 1."""
    return len(c.heads) if c.quantifier == "any_of" else 1


def _location(result: ClauseResult, confidence: float, df: float, n: int, method: str,
              how: str) -> Bound:
    """``value -+ q se`` with ``q`` the normal (``df = inf``) or t quantile."""
    c, value, se = result.clause, float(result.measured or 0.0), result.stderr
    if se is None or math.isnan(se):
        return Bound("none", confidence, examples=n, note="no standard error was measured")
    m = _heads(c)
    q = t_quantile(1.0 - (1.0 - confidence) / m, df)
    low, high = KINDS[c.kind].value_range(c)
    sides = _sides(c, value)
    p = max(min(1.0, m * location_p(margin, se, df)) for _, margin in sides)
    needed = [examples_for_location(margin, se, n, q) for _, margin in sides]
    return Bound(method, confidence,
                 lower=max(low, value - q * se) if c.at_least is not None else None,
                 upper=min(high, value + q * se) if c.at_most is not None else None,
                 p_value=p, examples=n, needed=_needed(result, p, confidence, needed),
                 note=how + (f"; Bonferroni over {m} heads" if m > 1 else ""))


def _binomial(result: ClauseResult, confidence: float, k: float, n_eff: float, n: int,
              method: str, how: str) -> Bound:
    """Clopper-Pearson bounds from ``k`` of ``n_eff`` (``n``: the examples behind them)."""
    c, value = result.clause, float(result.measured or 0.0)
    p = max(binomial_p(k, n_eff, float(t), side) for side, t in _thresholds(c))
    needed = [None if (N := examples_for_binomial(value, float(t), side, confidence)) is None
              else math.ceil(N * n / n_eff) for side, t in _thresholds(c)]
    return Bound(method, confidence,
                 lower=binomial_lower(k, n_eff, confidence) if c.at_least is not None else None,
                 upper=binomial_upper(k, n_eff, confidence) if c.at_most is not None else None,
                 p_value=p, examples=n, needed=_needed(result, p, confidence, needed), note=how)


def _thresholds(c: Clause) -> list[tuple[str, float]]:
    return [(side, t) for side, t in zip(_SIDES, (c.at_least, c.at_most), strict=True)
            if t is not None]


def _sides(c: Clause, value: float) -> list[tuple[str, float]]:
    """``(side, margin)`` per bound the clause sets (``> 0``: the value is on its right side)."""
    return [(side, value - t if side == "at_least" else t - value)
            for side, t in _thresholds(c)]


def _needed(result: ClauseResult, p: float, confidence: float,
            per_side: list[int | None]) -> int | None:
    """Examples certification needs, for a clause that holds but is not certified (the
    largest side's; ``None`` when a side cannot be certified at its margin)."""
    if not result.passed or p <= 1.0 - confidence or any(n is None for n in per_side):
        return None
    return max(n for n in per_side if n is not None)
