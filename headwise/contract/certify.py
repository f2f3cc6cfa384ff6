"""Each clause's one-sided confidence bound at the contract's level, and the test it inverts.

Which bound a clause gets follows from what its measured value is (``Bound.method``):

- a task clause's ``exact`` metric, and its ``accuracy`` when every example scores one position,
  is a share of ``n`` independent examples: the exact binomial (Clopper-Pearson) bound on the
  ``k`` right of ``n``;
- a task clause's token ``accuracy`` over several positions per example is a clustered
  proportion (an example's tokens are not independent): Clopper-Pearson at the Korn-Graubard
  effective sample size ``n* = p (1 - p) / se^2`` (Korn and Graubard 1998; at most the number of
  scored positions; the number of examples when ``p`` is 0 or 1, a bound on the share of
  examples right throughout, which the token accuracy is at least when examples score equally
  many positions), ``se`` the ratio estimator's standard error with each example its own group;
- a task clause's ``loss`` (a ratio of per-example sums, right-skewed): the studentised
  (bootstrap-t) bound, ``value - q* se`` with ``q*`` the quantile of ``(R* - R) / se*`` over
  1000 resamples of the examples (second-order accurate where a normal bound on skewed losses
  is not);
- an ablation drop: the normal bound ``value -+ z se`` on the paired bootstrap standard error
  over examples; an accuracy drop of exactly 0 with no spread (no example changed) gets
  half-width ``1 - alpha^(1/n)``, the Clopper-Pearson bound on the share of examples that
  change (which bounds the drop when examples score equally many positions); another drop
  without spread gets no bound. The normal bound is approximate: for a drop made of few
  changed examples it certifies a false cap more often than its level (docs/contracts.md);
- a role score and a ``preserve`` distance: the Student-t bound ``value -+ t_{G-1} se`` on the
  grouped ratio estimator's standard error over ``G`` (at most 16) groups of sequences;
- a path's drop and a circuit's share kept or outside drop: as an ablation drop (their paired
  bootstrap);
- an exclusive clause, a ``role_drift`` clause and a kind whose entry gives none carry no
  standard error: no bound, and they are never certified.

Each kind says which bound its clauses get (``ClauseKind.bound``, calling the functions here).

A clause bounded on both sides needs both bounds past their thresholds (an intersection-union
test: its p-value is the larger side's). An ``all_of`` clause is decided by its worst head and an
``any_of`` clause by its best; with ``m`` heads an ``any_of`` bound is at level ``1 - (1 - c) /
m`` (Bonferroni: which head decides is chosen on the same data). Only the deciding head's
standard error is measured, and every head's is taken to be that one.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from headwise.analysis.importance import example_stats
from headwise.analysis.importance_matrix import STDERR_GROUPS, ratio_stderr
from headwise.confidence import (
    binomial_lower,
    binomial_p,
    binomial_upper,
    examples_for_binomial,
    examples_for_location,
    location_p,
    t_quantile,
)
from headwise.contract.clause import UNIT_METRICS, Clause
from headwise.contract.results import Bound, ClauseResult, VerifyData

BOOTSTRAP_T = 1000  # resamples of the studentised bootstrap (task losses)


def certify(result: ClauseResult, model: nn.Module, data: VerifyData,
            confidence: float) -> Bound:
    """The bound of ``result``'s clause at ``confidence``, measured on ``data`` (``model``:
    the model measured, which a task clause's per-example statistics are read from)."""
    if result.measured is None or math.isnan(result.measured):
        return Bound("none", confidence, note="nothing was measured")
    return result.clause.entry.bound(result, model, data, confidence)


def task_clause_bound(result: ClauseResult, model: nn.Module, data: VerifyData,
                      confidence: float) -> Bound:
    c = result.clause
    batch = data.batch(c.task or "", c.path)
    kw = {k: v for k in ("attention_mask", "task_ids")
          if (v := getattr(batch, k, None)) is not None}
    with torch.no_grad():
        num, count = example_stats(model(batch.tokens, **kw), batch.targets)[c.metric]
    return task_bound(result, num.detach().double().cpu(), count.double().cpu(), confidence)


def task_bound(result: ClauseResult, num: Tensor, count: Tensor, confidence: float) -> Bound:
    """A task clause's bound from per-example numerators and counts (``example_stats``: the
    metric is ``sum(num) / sum(count)``), as the module docstring states."""
    c = result.clause
    value = float(result.measured or 0.0)
    scored = count > 0
    num, count = num[scored], count[scored]  # (n,)
    n = int(count.numel())
    if n < 2:
        return Bound("none", confidence, examples=n, note="fewer than two scored examples")
    if c.metric == "loss":
        return _bootstrap_t(result, num, count, confidence)
    if c.metric == "exact" or bool((count == 1).all()):
        k = round(float(num.sum()))
        return _binomial(result, confidence, k, n, n, "clopper-pearson", f"{k} of {n} examples")
    positions = float(count.sum())
    se = ratio_stderr(num, count)
    n_eff = (float(n) if value in (0.0, 1.0) or not se > 0
             else min(positions, value * (1.0 - value) / se ** 2))
    return _binomial(result, confidence, value * n_eff, n_eff, n,
                     "clopper-pearson (effective n)",
                     f"effective sample size {n_eff:.1f} from {n} examples of {positions:.0f} "
                     "scored positions")


def _bootstrap_t(result: ClauseResult, num: Tensor, count: Tensor, confidence: float) -> Bound:
    """The studentised bootstrap bound of the ratio ``sum(num) / sum(count)`` over examples."""
    n = int(num.numel())
    ratio, se = float(num.sum() / count.sum()), ratio_stderr(num, count)
    if not se > 0:
        return _location(result, confidence, se, math.inf, n, "normal",
                         "every example alike: no spread")
    gen = torch.Generator().manual_seed(0)
    stats = []
    for start in range(0, BOOTSTRAP_T, max(1, (1 << 22) // n)):  # memory-sized blocks
        b = min(BOOTSTRAP_T - start, max(1, (1 << 22) // n))
        idx = torch.randint(0, n, (b, n), generator=gen)
        x, w = num[idx], count[idx]  # (b, n)
        r = x.sum(1) / w.sum(1)
        s = ((x - r[:, None] * w).square().sum(1) * n / (n - 1)).sqrt() / w.sum(1)
        # a resample without spread: t* is infinite (its sign), or 0 on the estimate itself
        stats.append(torch.where(s > 0, (r - ratio) / s, (r - ratio).sign() * math.inf))
    t_star = torch.cat(stats).sort().values  # (BOOTSTRAP_T,)
    k = min(BOOTSTRAP_T - 1, int((1.0 - confidence) * BOOTSTRAP_T))
    low_q, high_q = float(t_star[k]), float(t_star[BOOTSTRAP_T - 1 - k])
    c = result.clause
    value = float(result.measured or ratio)
    # at_least: value - high_q se >= t  <=>  P*(t* >= (value - t) / se) <= alpha; at_most:
    # value - low_q se <= t  <=>  P*(t* <= (value - t) / se) <= alpha
    p = max(float((t_star >= (value - t) / se).double().mean()) if side == "at_least"
            else float((t_star <= (value - t) / se).double().mean())
            for side, t in _thresholds(c))
    needed = [examples_for_location(margin, se, n, high_q if side == "at_least" else -low_q)
              for side, margin in _sides(c, value)]
    low, high = c.entry.value_range(c)
    return Bound("bootstrap-t", confidence,
                 lower=_finite(max(low, value - high_q * se)) if c.at_least is not None else None,
                 upper=_finite(min(high, value - low_q * se)) if c.at_most is not None else None,
                 p_value=p, examples=n, needed=_needed(result, p, confidence, needed),
                 note=f"studentised bootstrap over {n} examples ({BOOTSTRAP_T} resamples)")


def drop_bound(result: ClauseResult, model: nn.Module, data: VerifyData,
               confidence: float) -> Bound:
    c = result.clause
    n = int(data.batch(c.task or "", c.path).tokens.shape[0])
    se = result.stderr
    if se == 0.0 and result.measured == 0.0 and c.metric in UNIT_METRICS:
        return _unchanged(result, n, confidence)
    if se == 0.0:
        return Bound("none", confidence, examples=n, note="a drop without spread")
    return _location(result, confidence, se, math.inf, n, "normal",
                     "paired bootstrap standard error over examples")


def _unchanged(result: ClauseResult, n: int, confidence: float) -> Bound:
    """No example changed: half-width ``u = 1 - alpha^(1/n)``, p-value ``(1 - margin)^n``."""
    c = result.clause
    alpha = (1.0 - confidence) / _heads(c)
    u = binomial_upper(0, n, 1.0 - alpha)
    ps = [min(1.0, _heads(c) * binomial_p(0, n, margin, "at_most")) if margin > 0 else 1.0
          for _, margin in _sides(c, 0.0)]
    needed = [examples_for_binomial(0.0, margin, "at_most", 1.0 - alpha) if margin > 0 else None
              for _, margin in _sides(c, 0.0)]
    return Bound("clopper-pearson", confidence,
                 lower=-u if c.at_least is not None else None,
                 upper=u if c.at_most is not None else None, p_value=max(ps), examples=n,
                 needed=_needed(result, max(ps), confidence, needed),
                 note=f"no example of {n} changed: the share that could is at most {u:.4f}")


def grouped_bound(result: ClauseResult, data: VerifyData, confidence: float,
                  on_task: bool) -> Bound:
    """Student-t on the grouped ratio estimator's standard error; ``on_task``: a clause ``on``
    a task's name reads that task's rows (else the probe's)."""
    c = result.clause
    if on_task and c.on is not None and c.on in data.tasks:
        n = int(data.tasks[c.on].tokens.shape[0])
    else:
        n = int(data.probe(data.probe_name(c.on, c.path), c.path)[0].shape[0])
    groups = min(STDERR_GROUPS, n)
    if groups < 2 or result.stderr is None or math.isnan(result.stderr):
        return Bound("none", confidence, examples=n, note="no standard error was measured")
    return _location(result, confidence, result.stderr, groups - 1.0, n, "student-t",
                     f"grouped ratio standard error over {groups} groups of sequences")


def unbounded(result: ClauseResult, confidence: float, what: str | None = None) -> Bound:
    """No bound: the clause's measurement has no standard error (it holds, never certified)."""
    return Bound("none", confidence, note="no standard error is estimated for clauses of "
                 + (what or f"kind {result.clause.kind}"))


def _heads(c: Clause) -> int:
    """How many heads an ``any_of`` clause chose among (its Bonferroni factor), else 1."""
    return len(c.heads) if c.quantifier == "any_of" else 1


def _location(result: ClauseResult, confidence: float, se: float | None, df: float, n: int,
              method: str, how: str) -> Bound:
    """``value -+ q se`` with ``q`` the normal (``df = inf``) or t quantile."""
    c, value = result.clause, float(result.measured or 0.0)
    if se is None or math.isnan(se):
        return Bound("none", confidence, examples=n, note="no standard error was measured")
    m = _heads(c)
    q = t_quantile(1.0 - (1.0 - confidence) / m, df)
    low, high = c.entry.value_range(c)
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


def _finite(bound: float) -> float | None:
    """A bound, or ``None`` where the resamples leave it unbounded (JSON has no infinity)."""
    return bound if math.isfinite(bound) else None


def _thresholds(c: Clause) -> list[tuple[str, float]]:
    return [(side, t) for side, t in zip(("at_least", "at_most"), (c.at_least, c.at_most),
                                         strict=True) if t is not None]


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
