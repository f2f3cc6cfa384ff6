"""ImportanceMatrix (units x tasks x metrics with bootstrap CIs) and the paired bootstrap."""

from __future__ import annotations

import math
from collections.abc import Sequence
from statistics import NormalDist
from typing import Any

import torch
from rich.table import Table
from torch import Tensor

from headwise.heads import Head, HeadSet
from headwise.render.numbers import fixed
from headwise.render.tables import TextTable


def bootstrap_ci(clean_num: Tensor, ablated_num: Tensor, count: Tensor, sign: float,
                 n_boot: int, confidence: float,
                 gen: torch.Generator) -> tuple[float, float, float]:
    """Point estimate and percentile CI of ``sign * (ablated - clean)`` for ratio metrics.

    Each metric is ``sum(num) / sum(count)`` over examples; resampling draws examples with
    replacement and applies the same draw to both runs (paired).

    Args:
        clean_num, ablated_num, count: (B,) per-example numerators and counts.

    Returns:
        ``(point, low, high)``.
    """
    def metric(num: Tensor, idx: Tensor | None = None) -> Tensor:
        n, c = (num, count) if idx is None else (num[idx], count[idx])
        return n.sum(-1) / c.sum(-1).clamp_min(1e-12)

    point = float(sign * (metric(ablated_num) - metric(clean_num)))
    B = clean_num.shape[0]
    if n_boot <= 0 or B < 2:
        return point, math.nan, math.nan
    idx = torch.randint(0, B, (n_boot, B), generator=gen)
    diffs = sign * (metric(ablated_num, idx) - metric(clean_num, idx))  # (n_boot,)
    alpha = (1.0 - confidence) / 2
    q = torch.quantile(diffs, torch.tensor([alpha, 1 - alpha], dtype=diffs.dtype))
    return point, float(q[0]), float(q[1])


def bootstrap_value_ci(num: Tensor, count: Tensor, n_boot: int, confidence: float,
                       gen: torch.Generator) -> tuple[float, float, float]:
    """Point estimate and percentile CI of one ratio metric ``sum(num) / sum(count)``.

    The same example resampling as ``bootstrap_ci``, for a task's own metric (task clauses).
    """
    return bootstrap_ci(torch.zeros_like(num), num, count, 1.0, n_boot, confidence, gen)


# Groups of sequences a measurement's standard error is estimated over (``ratio_stderr``):
# role scores, preserve distances.
STDERR_GROUPS = 16


def ratio_stderr(num: Tensor, den: Tensor) -> float:
    """Standard error of the ratio ``sum(num) / sum(den)`` over independent groups (each
    group's numerator and denominator): the linearised (cluster) estimator
    ``sqrt(G / (G - 1) * sum_g (num_g - R den_g)^2) / sum(den)``; NaN with fewer than two
    groups or no denominator."""
    num, den = num.double().flatten(), den.double().flatten()
    total = float(den.sum())
    if num.numel() < 2 or total <= 0:
        return math.nan
    ratio = num.sum() / total
    g = num.numel()
    return float(((num - ratio * den).square().sum() * g / (g - 1)).sqrt() / total)


def ratio_skewness(num: Tensor, den: Tensor) -> float:
    """Skewness of the units' linearised values ``u_i = num_i - R den_i`` (``R`` the ratio
    ``sum(num) / sum(den)``, so their mean is 0): the skew a t bound on the ratio corrects for
    (``headwise.confidence.skewed_t``). NaN with fewer than three units, no denominator, or no
    spread.

    The sample skewness ``m3 / m2^1.5`` underestimates a skewed population's: 64 sequences of
    skewness 2.8 measure 2.0 on average, and a bound corrected by too little certifies false
    clauses too often. From four units on, it is corrected by the jackknife (Efron and
    Tibshirani 1993, ch. 10): ``n g - (n - 1) mean_i g_(i)``, ``g_(i)`` the skewness with unit
    ``i`` left out (its ratio recomputed too: ``_left_out_skewness``), which removes the
    estimate's ``O(1/n)`` bias; where a unit's absence leaves no spread or no denominator, the
    sample skewness is returned as it is."""
    num, den = num.double().flatten(), den.double().flatten()
    total = float(den.sum())
    if num.numel() < 3 or total <= 0:
        return math.nan
    u = num - num.sum() / total * den
    m2 = float(u.square().mean())
    if not m2 > 0:
        return math.nan
    g = float(u.pow(3).mean()) / m2 ** 1.5
    left_out = _left_out_skewness(u, den, total)
    if left_out is None:
        return g
    n = u.numel()
    return n * g - (n - 1) * float(left_out.mean())


def _left_out_skewness(u: Tensor, den: Tensor, total: float) -> Tensor | None:
    """``g_(i)`` for every unit ``i`` at once, from power sums: leaving unit ``i`` out moves the
    ratio by ``delta_i = -u_i / (total - den_i)``, so the others' linearised values are
    ``u_j - delta_i den_j``, whose mean is again 0; their second and third moments expand in
    ``delta_i`` over sums of ``u^a den^b`` less unit ``i``'s own term. ``None`` with fewer
    than four units, or where a unit's absence leaves no denominator or no spread."""
    n = u.numel()
    rest = total - den
    if n < 4 or not bool((rest > 0).all()):
        return None
    d = -u / rest
    own = u - d * den  # unit i's linearised value at the others' ratio
    m2 = ((u.square().sum() - 2 * d * (u * den).sum() + d.square() * den.square().sum())
          - own.square()) / (n - 1)
    m3 = ((u.pow(3).sum() - 3 * d * (u.square() * den).sum()
           + 3 * d.square() * (u * den.square()).sum() - d.pow(3) * den.pow(3).sum())
          - own.pow(3)) / (n - 1)
    if not bool((m2 > 0).all()):
        return None
    return m3 / m2.pow(1.5)


def ci_stderr(low: float, high: float, confidence: float = 0.95) -> float:
    """The standard error a two-sided normal interval ``[low, high]`` at ``confidence`` implies
    (a bootstrap percentile interval read the same way); NaN for an undefined interval."""
    if not (math.isfinite(low) and math.isfinite(high)):
        return math.nan
    return (high - low) / (2.0 * NormalDist().inv_cdf(0.5 + confidence / 2.0))


class ImportanceMatrix:
    """Importance of units (single heads or head groups) for tasks, per metric.

    Attributes:
        units: the HeadSets (``labels`` their text, e.g. ``L1.H2``).
        values, ci_low, ci_high: (U, K, M) tensors.
        clean: ``{task: {metric: value}}`` without intervention.
        ablated: (U, K, M) metric values under the intervention (ablation only).
    """

    def __init__(self, units: Sequence[HeadSet], tasks: Sequence[str], metrics: Sequence[str],
                 values: Tensor, ci_low: Tensor, ci_high: Tensor,
                 clean: dict[str, dict[str, float]], ablated: Tensor | None,
                 info: dict[str, Any]) -> None:
        self.units = list(units)
        self.labels = [str(u) for u in self.units]
        self.tasks, self.metrics = list(tasks), list(metrics)
        self.values, self.ci_low, self.ci_high = values, ci_low, ci_high
        self.clean, self.ablated, self.info = clean, ablated, info

    def _index(self, unit: Head | HeadSet | str, task: str, metric: str) -> tuple[int, int, int]:
        label = str(unit)
        if label not in self.labels:
            raise KeyError(f"unit {label!r} not measured; units: {self.labels}")
        if task not in self.tasks:
            raise KeyError(f"task {task!r} not measured; tasks: {self.tasks}")
        if metric not in self.metrics:
            raise KeyError(f"metric {metric!r} not measured; metrics: {self.metrics}")
        return self.labels.index(label), self.tasks.index(task), self.metrics.index(metric)

    def get(self, unit: Head | HeadSet | str, task: str, metric: str = "accuracy") -> float:
        """The drop (or gradient importance) of ``unit`` on ``task``."""
        return float(self.values[self._index(unit, task, metric)])

    def ci(self, unit: Head | HeadSet | str, task: str,
           metric: str = "accuracy") -> tuple[float, float]:
        """Its bootstrap confidence interval."""
        i = self._index(unit, task, metric)
        return float(self.ci_low[i]), float(self.ci_high[i])

    def matrix(self, metric: str) -> Tensor:
        """(U, K) values for one metric."""
        return self.values[:, :, self.metrics.index(metric)]

    def to_records(self) -> list[dict[str, Any]]:
        """One JSON-ready record per (unit, task, metric)."""
        out = []
        for u, label in enumerate(self.labels):
            for k, task in enumerate(self.tasks):
                for m, metric in enumerate(self.metrics):
                    rec: dict[str, Any] = {
                        "unit": label, "task": task, "metric": metric,
                        "value": _num(self.values[u, k, m]),
                        "ci_low": _num(self.ci_low[u, k, m]),
                        "ci_high": _num(self.ci_high[u, k, m]),
                        "clean": _num(self.clean.get(task, {}).get(metric, math.nan)),
                        "method": self.info.get("method"), "mode": self.info.get("mode")}
                    if len(self.units[u]) == 1:
                        (h,) = tuple(self.units[u])
                        rec["layer"], rec["head"] = h.layer, h.head
                    if self.ablated is not None:
                        rec["ablated"] = _num(self.ablated[u, k, m])
                    out.append(rec)
        return out

    def to_text_table(self, metric: str | None = None) -> TextTable:
        """Units x tasks for one metric (default the first), ``value [low, high]`` cells."""
        metric = metric or self.metrics[0]
        m = self.metrics.index(metric)
        rows = tuple((label, *(f"{fixed(float(self.values[u, k, m]), sign=True)} "
                               f"[{fixed(float(self.ci_low[u, k, m]), sign=True)}, "
                               f"{fixed(float(self.ci_high[u, k, m]), sign=True)}]"
                               for k in range(len(self.tasks))))
                     for u, label in enumerate(self.labels))
        return TextTable(f"importance ({self.info.get('method')}, {metric})",
                         ("unit", *self.tasks), rows, right=tuple(range(1, len(self.tasks) + 1)))

    def to_rich_table(self, metric: str | None = None) -> Table:
        """``to_text_table`` as one rich Table."""
        return self.to_text_table(metric).rich_tables()[0]


def _num(v: Any) -> float | None:
    f = float(v)
    return None if math.isnan(f) else f
