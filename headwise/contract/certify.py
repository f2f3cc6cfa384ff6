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
  (bootstrap-t) bound ``value - q* se`` (``headwise.confidence.bootstrap_t``);
- an accuracy or exact drop (ablation, path, a circuit's outside drop) from per-example paired
  outcomes: an example is *harmed* when the intervention loses it right tokens and *helped*
  when it gains them, and the drop is the share harmed ``h`` less the share helped ``g``. A cap
  ``b > 0``: ``drop <= h``, so the Clopper-Pearson upper bound on ``h`` bounds the drop (exact
  in ``h``, conservative in the drop); a floor ``a >= 0`` (or a cap ``b <= 0``, which the share
  harmed alone cannot meet): ``L(h) - U(g)``, each at ``1 - alpha / 2`` (Bonferroni); a floor
  ``a < 0``: ``drop >= -g``, so ``-U(g)``. Shares over several positions per example are taken
  at their effective sample sizes, as a task's token accuracy is;
- a loss drop: bootstrap-t on the per-example paired loss differences;
- a circuit's share kept ``(M(circuit) - M(empty)) / (M(model) - M(empty))``: of an accuracy
  or exact match, ``1 - D1 / D2`` with ``D1`` the circuit's drop from the model and ``D2`` the
  empty circuit's, each a paired drop as above: ``1 - max(U(D1), 0) / L(D2)``, the two at
  ``1 - alpha / 2`` (Bonferroni; the share is at least that whenever both bounds hold), its
  p-value the smallest ``alpha`` at which it reaches the threshold (bisection). A circuit that
  keeps every example the model gets right has no spread but a tight bound. Of a loss:
  bootstrap-t on the ratio of per-example sums;
- an exclusive clause: one drop bound per task (listed tasks: the floor; the others: the cap),
  each at the clause's level; certified only when every one is (an intersection-union test,
  Berger 1982: the claim is an intersection, so no correction is needed);
- a ``preserve`` ``role_drift`` clause (the largest role-score change among the free heads):
  per head and role, both sides of ``|change| <= b`` by Student-t with ``G - 1`` degrees of
  freedom, the change's standard error taken as the two scores' summed (at least the paired
  grouped estimate, by Minkowski's inequality); certified only when every head and role is
  (intersection-union, no correction);
- a role score and a ``preserve`` distance: the Student-t bound ``value -+ t_{G-1} se`` on the
  grouped ratio estimator's standard error over ``G`` (at most 16) groups of sequences;
- a kind whose entry gives none: no bound, never certified.

Each kind says which bound its clauses get (``ClauseKind.bound``, calling the functions here).
The drop bounds recompute the per-example outcomes ``measure`` pooled: one clean and one
intervened pass (two for a share kept: the circuit and the empty circuit).

A clause bounded on both sides needs both bounds past their thresholds (an intersection-union
test: its p-value is the larger side's). An ``all_of`` clause needs every head's bounds past
(intersection-union); an ``any_of`` clause is decided by its best head, chosen on the same
data, so each head is bounded at ``1 - (1 - c) / m`` for ``m`` heads (Bonferroni). Score
clauses bound the deciding head on its standard error, except ``all_of``: every head on its
own (``ClauseResult.details["spread_per_head"]``), intersection-union. A grouped ratio's
bound is moved by the (jackknifed) skewness of its sequences (``details["skew"]``; Hall's
transformation, ``headwise.confidence.skewed_t``).

``examples_if_perfect`` inverts the same bounds before any run: the examples at which a clause
measured at its best attainable value would be certified, which sizes the verification set
(``Contract.verification_examples``).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

from headwise.analysis.batched_ablation import ablated_stats
from headwise.analysis.circuit import circuit_edges, patched_stats
from headwise.analysis.importance import example_stats
from headwise.analysis.importance_matrix import STDERR_GROUPS, ratio_stderr
from headwise.analysis.paths import PathPatcher
from headwise.analysis.scored import forward_kwargs
from headwise.confidence import (
    BOOTSTRAP_T,
    binomial_lower,
    binomial_p,
    binomial_upper,
    bootstrap_t,
    bootstrap_t_side,
    difference_examples_if_perfect,
    difference_lower,
    difference_p,
    examples_for_binomial,
    examples_for_difference,
    examples_for_location,
    fewest,
    share_examples_if_perfect,
    skew_term,
    skewed_location_p,
    skewed_t_inverse,
    t_cdf,
    t_quantile,
)
from headwise.contract.clause import UNIT_METRICS, Clause
from headwise.contract.results import Bound, ClauseResult, VerifyData
from headwise.heads import select_heads
from headwise.hooks.graph import all_edges

Paired = tuple[Tensor, Tensor, Tensor]  # per example: clean, intervened numerators, counts (n,)


def certify(result: ClauseResult, model: nn.Module, data: VerifyData,
            confidence: float) -> Bound:
    """The bound of ``result``'s clause at ``confidence``, measured on ``data`` (``model``:
    the model measured, which a task clause's per-example statistics are read from)."""
    if result.measured is None or math.isnan(result.measured):
        return Bound("none", confidence, note="nothing was measured")
    return result.clause.entry.bound(result, model, data, confidence)


@dataclass(frozen=True)
class _Side:
    """One one-sided test: its bound (may be infinite), p-value, and a function giving the
    examples that would certify it (called only for a clause that holds, uncertified)."""

    side: str
    bound: float
    p: float
    needed: Callable[[], int | None]


def task_clause_bound(result: ClauseResult, model: nn.Module, data: VerifyData,
                      confidence: float) -> Bound:
    c = result.clause
    batch = data.batch(c.task or "", c.path)
    with torch.no_grad():
        num, count = example_stats(model(batch.tokens, **forward_kwargs(batch)),
                                   batch.targets)[c.metric]
    return task_bound(result, num.detach().double().cpu(), count.double().cpu(), confidence)


def task_bound(result: ClauseResult, num: Tensor, count: Tensor, confidence: float) -> Bound:
    """A task clause's bound from per-example numerators and counts (``example_stats``: the
    metric is ``sum(num) / sum(count)``), as the module docstring states."""
    c = result.clause
    scored = count > 0
    num, count = num[scored], count[scored]  # (n,)
    n = int(count.numel())
    if n < 2:
        return Bound("none", confidence, examples=n, note="fewer than two scored examples")
    if c.metric == "loss":
        sides = _bootstrap_sides(num, count, _thresholds(c), confidence)
        if sides is None:
            return _location(result, confidence, 0.0, math.inf, n, "normal",
                             "every example alike: no spread")
        return _combine(result, [sides], confidence, n, "bootstrap-t",
                        f"studentised bootstrap over {n} examples ({BOOTSTRAP_T} resamples)")
    k, n_eff, how = _share(num, count)
    sides = [_binomial_side(k, n_eff, n, side, t, confidence) for side, t in _thresholds(c)]
    exact = n_eff == n and bool((count == 1).all())
    return _combine(result, [sides], confidence, n,
                    "clopper-pearson" if exact else "clopper-pearson (effective n)",
                    f"{k:.0f} of {n} examples" if exact else how)


def _share(num: Tensor, count: Tensor) -> tuple[float, float, str]:
    """``(k, n)`` of a share ``sum(num) / sum(count)`` over examples, for Clopper-Pearson: the
    successes of ``n`` examples when each scores one position, else at the Korn-Graubard
    effective sample size (``n`` examples when the share is 0 or 1); and the words for it."""
    n = int(count.numel())
    if bool((count == 1).all()):
        return float(round(float(num.sum()))), float(n), f"{float(num.sum()):.0f} of {n}"
    positions = float(count.sum())
    p = float(num.sum()) / positions
    se = ratio_stderr(num, count)
    n_eff = (float(n) if p in (0.0, 1.0) or not se > 0
             else min(positions, p * (1.0 - p) / se ** 2))
    return (p * n_eff, n_eff, f"effective sample size {n_eff:.1f} from {n} examples of "
            f"{positions:.0f} scored positions")


def _binomial_side(k: float, n_eff: float, n: int, side: str, t: float,
                   confidence: float) -> _Side:
    """Clopper-Pearson on ``k`` of ``n_eff`` (``n``: the examples behind them)."""
    rate = k / n_eff

    def needed() -> int | None:
        got = examples_for_binomial(rate, t, side, confidence)
        return None if got is None else math.ceil(got * n / n_eff)

    if side == "at_least":
        return _Side(side, binomial_lower(k, n_eff, confidence),
                     binomial_p(k, n_eff, t, side), needed)
    return _Side(side, binomial_upper(k, n_eff, confidence), binomial_p(k, n_eff, t, side),
                 needed)


def _bootstrap_sides(num: Tensor, den: Tensor, thresholds: list[tuple[str, float]],
                     confidence: float) -> list[_Side] | None:
    """Bootstrap-t sides of the ratio ``sum(num) / sum(den)`` over examples (``None`` without
    spread or without a positive ``sum(den)``: no bound)."""
    n = int(num.numel())
    value, se = float(num.sum() / den.sum()), ratio_stderr(num, den)
    if not (se > 0 and float(den.sum()) > 0):
        return None
    t_star = bootstrap_t(num[None], den[None])
    out = []
    for side, t in thresholds:
        bound_t, p_t = bootstrap_t_side(torch.tensor([value], dtype=torch.float64),
                                        torch.tensor([se], dtype=torch.float64), t_star, t,
                                        side, confidence)
        bound = float(bound_t[0])
        margin = value - t if side == "at_least" else t - value
        q = (value - bound) / se if side == "at_least" else (bound - value) / se

        def needed(margin: float = margin, q: float = q) -> int | None:
            return examples_for_location(margin, se, n, q)

        out.append(_Side(side, bound, float(p_t[0]), needed))
    return out


def _drop_sides(metric: str, paired: Paired, thresholds: list[tuple[str, float]],
                confidence: float) -> tuple[list[_Side], str, str] | None:
    """The sides of a drop (clean - intervened for accuracies, the loss's increase) from its
    per-example paired outcomes, with the method and the words; ``None``: no bound."""
    clean, after, count = paired
    scored = count > 0
    clean, after, count = clean[scored], after[scored], count[scored]
    n = int(count.numel())
    if n < 2:
        return None
    if metric not in UNIT_METRICS:
        sides = _bootstrap_sides(after - clean, count, thresholds, confidence)
        return None if sides is None else (
            sides, "bootstrap-t (paired)",
            f"studentised bootstrap of the paired loss change over {n} examples "
            f"({BOOTSTRAP_T} resamples)")
    diff = clean - after  # (n,) right tokens lost per example
    kh, nh, words_h = _share(diff.clamp_min(0), count)
    kg, ng, _ = _share((-diff).clamp_min(0), count)
    out = []
    for side, t in thresholds:
        if side == "at_most" and t > 0:  # drop <= share harmed
            out.append(_binomial_side(kh, nh, n, side, t, confidence))
        elif side == "at_least" and t < 0:  # drop >= -(share helped)
            s = _binomial_side(kg, ng, n, "at_most", -t, confidence)
            out.append(_Side(side, -s.bound, s.p, s.needed))
        else:  # h - g, or g - h for a cap: each share at 1 - alpha / 2
            (k1, n1), (k2, n2), t1 = (((kh, nh), (kg, ng), t) if side == "at_least"
                                       else ((kg, ng), (kh, nh), -t))
            low = difference_lower(k1, n1, k2, n2, confidence)
            scale = max(n / n1, n / n2)

            def needed(k1: float = k1, n1: float = n1, k2: float = k2, n2: float = n2,
                       t1: float = t1, scale: float = scale) -> int | None:
                got = examples_for_difference(k1 / n1, k2 / n2, t1, confidence)
                return None if got is None else math.ceil(got * scale)

            out.append(_Side(side, low if side == "at_least" else -low,
                             difference_p(k1, n1, k2, n2, t1), needed))
    exact = nh == n and ng == n and bool((count == 1).all())
    how = (f"{kh:.0f} of {n} examples harmed, {kg:.0f} helped" if exact else
           f"shares harmed and helped, {words_h}")
    return (out, "clopper-pearson (paired)" if exact else
            "clopper-pearson (paired, effective n)", how)


def paired_drop_bound(result: ClauseResult, units: Sequence[Paired],
                      confidence: float) -> Bound:
    """A drop clause's bound from each unit's per-example paired outcomes (one unit, or one
    per head of an ``all_of`` / ``any_of`` clause): ``(clean, intervened, count)``, each (n,)
    float64 in ``example_stats``' layout."""
    c = result.clause
    conf = 1.0 - (1.0 - confidence) / any_of_heads(c)
    parts = [_drop_sides(c.metric, u, _thresholds(c), conf) for u in units]
    n = int((units[0][2] > 0).sum())
    if any(p is None for p in parts):
        return Bound("none", confidence, examples=n, note="a drop without spread")
    done = [p for p in parts if p is not None]
    return _combine(result, [p[0] for p in done], confidence, n, done[0][1], done[0][2])


def ablation_bound(result: ClauseResult, model: nn.Module, data: VerifyData,
                   confidence: float) -> Bound:
    """An ablation clause's bound: each unit (the set, or each head) ablated once more on the
    task's batch for its per-example outcomes."""
    c = result.clause
    batch = data.batch(c.task or "", c.path)
    groups = [c.heads] if c.quantifier == "set" else [str(h) for h in c.heads]
    clean, ablated = _ablated(model, batch, groups, c.mode or "zero")
    return paired_drop_bound(result, [_paired(clean, a, c.metric) for a in ablated], confidence)


def path_bound(result: ClauseResult, model: nn.Module, data: VerifyData,
               confidence: float) -> Bound:
    """A path clause's bound: the edge path-patched once more for per-example outcomes."""
    c = result.clause
    p = PathPatcher(model, data.batch(c.task or "", c.path), None, c.mode)
    (clean, count), (patched, _) = (patched_stats(p, e, c.metric) for e in ([], [c.edges[0]]))
    return paired_drop_bound(result, [(clean, patched, count)], confidence)


def circuit_bound(result: ClauseResult, model: nn.Module, data: VerifyData,
                  confidence: float) -> Bound:
    """A circuit clause's bound: its outside drop as a drop; its share kept by bootstrap-t on
    ``sum(circuit - empty) / sum(model - empty)`` over examples."""
    c = result.clause
    p = PathPatcher(model, data.batch(c.task or "", c.path), None, c.mode)
    inside = circuit_edges(model, [str(x) for x in c.edges], c.path)
    every = all_edges(model)
    full, count = patched_stats(p, [], c.metric)
    circuit, _ = patched_stats(p, [e for e in every if e not in inside], c.metric)
    if c.at_least is None:
        return paired_drop_bound(result, [(full, circuit, count)], confidence)
    empty, _ = patched_stats(p, every, c.metric)
    return kept_bound(result, (full, circuit, empty, count), confidence)


def kept_bound(result: ClauseResult, stats: tuple[Tensor, Tensor, Tensor, Tensor],
               confidence: float) -> Bound:
    """A circuit's share kept, from per-example ``(model, circuit, empty, count)`` (n,)
    numerators and counts: bootstrap-t on ``sum(circuit - empty) / sum(model - empty)`` (no
    bound when the model is no better than the empty circuit: the share does not exist)."""
    full, circuit, empty, count = stats
    scored = count > 0
    num, den = (circuit - empty)[scored], (full - empty)[scored]
    if float(den.sum()) < 0:  # a loss falls from the empty circuit to the model: the same ratio
        num, den = -num, -den
    n = int(scored.sum())
    if result.clause.metric in UNIT_METRICS and n >= 2:
        return _kept_by_drops(result, full[scored], circuit[scored], empty[scored],
                              count[scored], confidence)
    sides = _bootstrap_sides(num, den, _thresholds(result.clause), confidence) if n >= 2 \
        else None
    if sides is None:
        return Bound("none", confidence, examples=n,
                     note="the share kept has no spread, or the model is no better than the "
                     "empty circuit")
    return _combine(result, [sides], confidence, n, "bootstrap-t (ratio)",
                    f"studentised bootstrap of sum(circuit - empty) / sum(model - empty) "
                    f"over {n} examples ({BOOTSTRAP_T} resamples)")


def _kept_by_drops(result: ClauseResult, full: Tensor, circuit: Tensor, empty: Tensor,
                   count: Tensor, confidence: float) -> Bound:
    """A share kept of an accuracy from the two paired drops (module docstring): the lower
    bound ``1 - max(U(D1), 0) / L(D2)`` (``-inf`` unless ``L(D2) > 0``)."""
    (t,) = [t for side, t in _thresholds(result.clause) if side == "at_least"]
    d1, d2 = full - circuit, full - empty  # right tokens lost per example
    h1, g1 = _share(d1.clamp_min(0), count), _share((-d1).clamp_min(0), count)
    h2, g2 = _share(d2.clamp_min(0), count), _share((-d2).clamp_min(0), count)
    n = int(count.numel())

    def lower(alpha: float, scale: float = 1.0) -> float:
        """The bound at level ``1 - alpha``, the counts' rates kept at ``scale`` times n."""
        half = 1.0 - alpha / 2.0
        up1 = -difference_lower(g1[0] * scale, g1[1] * scale, h1[0] * scale, h1[1] * scale,
                                half)
        low2 = difference_lower(h2[0] * scale, h2[1] * scale, g2[0] * scale, g2[1] * scale,
                                half)
        return 1.0 - max(up1, 0.0) / low2 if low2 > 0 else -math.inf

    def p_value() -> float:
        if not lower(1.0 - 1e-9) >= t:
            return 1.0
        lo, hi = -15.0, 0.0  # log10 alpha: lower(10^x) grows with x
        if lower(10.0 ** lo) >= t:
            return 10.0 ** lo
        for _ in range(30):  # to 1.4e-8 in log10 alpha
            mid = (lo + hi) / 2.0
            lo, hi = (lo, mid) if lower(10.0 ** mid) >= t else (mid, hi)
        return 10.0 ** hi

    def needed() -> int | None:
        return fewest(lambda m: lower(1.0 - confidence, m / n) >= t)

    side = _Side("at_least", lower(1.0 - confidence), p_value(), needed)
    return _combine(result, [[side]], confidence, n, "clopper-pearson (ratio of drops)",
                    f"the circuit's and the empty circuit's paired drops over {n} examples, "
                    f"each at 1 - alpha / 2 ({h1[2]})")


def exclusive_bound(result: ClauseResult, model: nn.Module, data: VerifyData,
                    confidence: float) -> Bound:
    """An exclusive clause's bound: the set ablated once more on every task; a floor bound on
    each listed task's drop and a cap bound on each other task's, each at ``confidence``, and
    certified only when all are (intersection-union)."""
    c = result.clause
    assert c.at_least is not None and c.at_most is not None
    sides: list[_Side] = []
    methods = set()
    sizes = []
    for task, batch in data.tasks.items():
        clean, (ablated,) = _ablated(model, batch, [c.heads], c.mode or "zero")
        paired = _paired(clean, ablated, c.metric)
        side = ("at_least", c.at_least) if task in c.tasks else ("at_most", c.at_most)
        part = _drop_sides(c.metric, paired, [side], confidence)
        sizes.append(int((paired[2] > 0).sum()))
        if part is None:
            return Bound("none", confidence, examples=min(sizes),
                         note=f"the drop on {task} has no spread")
        sides += part[0]
        methods.add(part[1])
    return _combine(result, [sides], confidence, min(sizes), "intersection-union",
                    f"every listed task's drop bounded below and every other task's above, "
                    f"each at {100 * confidence:g}% ({', '.join(sorted(methods))}), over "
                    f"{len(data.tasks)} tasks' examples (at least {min(sizes)} each)")


def drift_bound(result: ClauseResult, change: Tensor, stderr: Tensor, groups: int,
                sequences: int, confidence: float) -> Bound:
    """A ``role_drift`` clause's bound: ``|change| <= b`` for every head and role.

    Args:
        change: (heads, roles) trained score - starting score (NaN: undefined, skipped).
        stderr: (heads, roles) the two scores' standard errors summed (at least the change's
            grouped standard error: Minkowski).
        groups: ``G``, the groups of probe sequences behind the standard errors.
        sequences: the probe's sequences.

    Per head and role both sides are tested by Student-t with ``G - 1`` degrees of freedom at
    ``confidence``; the clause is certified only when every test is (intersection-union): its
    p-value is the largest, at the smallest ``min(b - change, b + change) / se``, and its upper
    bound the largest ``|change| + t se``.
    """
    c = result.clause
    cap = float(c.at_most if c.at_most is not None else math.inf)
    keep = ~change.isnan()
    change, stderr = change[keep].double(), stderr[keep].double()
    if groups < 2 or not change.numel() or bool(stderr.isnan().any()):
        return Bound("none", confidence, examples=sequences,
                     note="no standard error was measured for a head's role score")
    df = groups - 1.0
    q = t_quantile(confidence, df)
    margin = torch.minimum(cap - change, cap + change)  # (pairs,) > 0: inside the cap
    z = torch.where(stderr > 0, margin / stderr, margin.sign() * math.inf)
    z_min = float(z.min())
    p = 1.0 if math.isnan(z_min) else (1.0 - t_cdf(z_min, df) if math.isfinite(z_min)
                                       else float(z_min < 0))
    upper = float((change.abs() + q * stderr).max())
    worst = int((margin - q * stderr).argmin())

    def needed() -> int | None:
        return examples_for_location(float(margin[worst]), float(stderr[worst]), sequences, q)

    low, high = c.entry.value_range(c)
    side = _Side("at_most", min(high, max(low, upper)), p, needed)
    return _combine(result, [[side]], confidence, sequences, "student-t (intersection-union)",
                    f"every free head's change in each of {change.numel()} head-role scores "
                    f"within the cap, both sides at {100 * confidence:g}% (Student-t, "
                    f"{groups - 1} df; se: the two scores' summed)")


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
    how = f"grouped ratio standard error over {groups} groups of sequences"
    each = result.details.get("spread_per_head")
    if c.quantifier == "all_of" and isinstance(each, dict):
        # every head's own bound past the threshold (intersection-union): the worst-measured
        # head's standard error says nothing of a better-measured head measured less precisely
        spreads = [(result.per_head.get(h), each.get(h) or {}) for h in map(str, c.heads)]
        known = [(float(v), float(s["stderr"]), s.get("skew")) for v, s in spreads
                 if v is not None and s.get("stderr") is not None
                 and not math.isnan(s["stderr"])]
        if groups < 2 or len(known) < len(spreads):
            return Bound("none", confidence, examples=n, note="no standard error was measured")
        units = [_location_sides(c, v, se, groups - 1.0, n, confidence, skew)
                 for v, se, skew in known]
        skewed = any(skew is not None for _, _, skew in known)
        return _combine(result, units, confidence, n, "student-t",
                        how + (_SKEWED if skewed else ""))
    if groups < 2 or result.stderr is None or math.isnan(result.stderr):
        return Bound("none", confidence, examples=n, note="no standard error was measured")
    skew = result.details.get("skew")
    return _location(result, confidence, result.stderr, groups - 1.0, n, "student-t",
                     how + (_SKEWED if skew is not None else ""), skew)


_SKEWED = "; moved by the sequences' skewness (Hall's transformation)"


def unbounded(result: ClauseResult, confidence: float, what: str | None = None) -> Bound:
    """No bound: the clause's measurement has no standard error (it holds, never certified)."""
    return Bound("none", confidence, note="no standard error is estimated for clauses of "
                 + (what or f"kind {result.clause.kind}"))


def _ablated(model: nn.Module, batch: Any, groups: Sequence[Any],
             mode: str) -> tuple[dict[str, tuple[Tensor, Tensor]],
                                 list[dict[str, tuple[Tensor, Tensor]]]]:
    """Per-example clean and ablated statistics of each group, as ``ablation_importance``
    draws them (mean and resample from the batch itself, seed 0)."""
    units = [select_heads(model, g) for g in groups]
    ref = None if mode == "zero" else batch.tokens
    with torch.no_grad():
        return ablated_stats(model, batch, units, mode, ref, forward_kwargs(batch))


def _paired(clean: dict[str, tuple[Tensor, Tensor]], after: dict[str, tuple[Tensor, Tensor]],
            metric: str) -> Paired:
    (c, count), (a, _) = clean[metric], after[metric]
    return c.detach().double().cpu(), a.detach().double().cpu(), count.double().cpu()


def _combine(result: ClauseResult, units: list[list[_Side]], confidence: float, n: int,
             method: str, how: str) -> Bound:
    """One bound from each unit's sides: ``all_of`` / one unit needs every side past its
    threshold (p-value: the largest); ``any_of`` the best head's (p-value: ``m`` times the
    smallest head's, Bonferroni; its sides were bounded at ``1 - (1 - c) / m``)."""
    c = result.clause
    m = any_of_heads(c) if len(units) > 1 else 1
    if m > 1:
        best = min(range(len(units)), key=lambda i: max(s.p for s in units[i]))
        sides = units[best]
        p = min(1.0, m * max(s.p for s in sides))
        how += f"; Bonferroni over {m} heads"
    else:
        sides = [s for u in units for s in u]
        p = max(s.p for s in sides)
        if len(units) > 1:
            how += f"; every one of {len(units)} heads (intersection-union)"
    low, high = c.entry.value_range(c)
    lows = [s.bound for s in sides if s.side == "at_least"]
    highs = [s.bound for s in sides if s.side == "at_most"]
    needed = None
    if result.passed:
        each = [s.needed() for s in sides]
        needed = None if None in each else max(x for x in each if x is not None)
    return Bound(method, confidence,
                 lower=_finite(max(low, min(lows))) if lows else None,
                 upper=_finite(min(high, max(highs))) if highs else None,
                 p_value=p, examples=n, needed=needed, note=how)


def any_of_heads(c: Clause) -> int:
    """How many heads an ``any_of`` clause chose among (its Bonferroni factor), else 1."""
    return len(c.heads) if c.quantifier == "any_of" else 1


def _location(result: ClauseResult, confidence: float, se: float | None, df: float, n: int,
              method: str, how: str, skew: float | None = None) -> Bound:
    """``value -+ q se`` with ``q`` the normal (``df = inf``) or t quantile (corrected for the
    skewness ``skew`` of ``n`` units where given: ``_location_sides``)."""
    c, value = result.clause, float(result.measured or 0.0)
    if se is None or math.isnan(se):
        return Bound("none", confidence, examples=n, note="no standard error was measured")
    m = any_of_heads(c)
    return _combine(result, [_location_sides(c, value, se, df, n, confidence, skew)],
                    confidence, n, method,
                    how + (f"; Bonferroni over {m} heads" if m > 1 else ""))


def _location_sides(c: Clause, value: float, se: float, df: float, n: int,
                    confidence: float, skew: float | None = None) -> list[_Side]:
    """The sides ``value -+ q se`` of ``c``'s thresholds, ``q`` at ``1 - (1 - c) / m`` for an
    ``any_of`` clause of ``m`` heads (its p-values ``m`` times the one-sided ones), moved by
    Hall's transformation for a mean of ``n`` units of skewness ``skew`` (``None``: none
    known; ``headwise.confidence.skewed_t``)."""
    m = any_of_heads(c)
    q = t_quantile(1.0 - (1.0 - confidence) / m, df)
    term = skew_term(skew, n)
    sides = []
    for side, t in _thresholds(c):
        margin = value - t if side == "at_least" else t - value
        toward = term if side == "at_least" else -term  # an upper bound mirrors the skew

        def needed(margin: float = margin) -> int | None:
            return examples_for_location(margin, se, n, q)

        reach = skewed_t_inverse(q, toward) * se
        sides.append(_Side(side, value - reach if side == "at_least" else value + reach,
                           min(1.0, m * skewed_location_p(margin, se, df, toward)), needed))
    return sides


def _finite(bound: float) -> float | None:
    """A bound, or ``None`` where the resamples leave it unbounded (JSON has no infinity)."""
    return bound if math.isfinite(bound) else None


def examples_if_perfect(clause: Clause, level: float, drop: bool,
                        sides: Sequence[tuple[str, float]] | None = None) -> int | None:
    """The fewest examples at which ``clause``'s bound is past every one of its ``sides``
    (default: its thresholds) at p-value ``level`` when measured at its best attainable value,
    by the bound the clause gets (module docstring): a share (``drop=False``: every example
    right for a floor, none for a cap) or an accuracy drop (every example harmed for a floor
    ``>= 0``, none for a cap ``> 0``; helped, or not, for the other two). ``None`` when no
    measurement could clear a side."""
    sizes = [(_drop_examples_if_perfect(side, t, level) if drop
              else share_examples_if_perfect(side, t, level))
             for side, t in (_thresholds(clause) if sides is None else sides)]
    known = [n for n in sizes if n is not None]
    return max(known) if known and len(known) == len(sizes) else None


def _drop_examples_if_perfect(side: str, t: float, level: float) -> int | None:
    if side == "at_most" and t > 0:  # the share harmed's upper bound, none harmed
        return share_examples_if_perfect("at_most", t, level)
    if side == "at_least" and t < 0:  # the share helped's upper bound, none helped
        return share_examples_if_perfect("at_most", -t, level)
    return difference_examples_if_perfect(t if side == "at_least" else -t, level)


def _thresholds(c: Clause) -> list[tuple[str, float]]:
    return [(side, t) for side, t in zip(("at_least", "at_most"), (c.at_least, c.at_most),
                                         strict=True) if t is not None]
