"""Clause-verdict forecasts: will a contract clause hold at the end of the budget?

A clause's *trajectory* is its measured value at each evaluation point (the enforcement set,
as ``--enforce`` and a watched plain run record it) with the value's standard error; its
*outcome* is whether it holds at the end (on the verification set). From the points of the
first ``fraction`` of the budget (the *extrapolated* value: a least-squares line through them,
their latest half from eight on, at the last step, clipped to the metric's range):

- ``ClauseForecaster``: a logistic model of the outcome on ``FEATURES`` (the latest, the best
  and the extrapolated *margin*, i.e. signed distance to the bound in the metric's ``scale``,
  > 0 when the clause holds, each squashed by ``tanh(SQUASH x)``; the line's slope; the share of
  early points that held; the latest margin in standard errors; whether the run enforces, and
  each of those times that; which kind of clause it is, task, score or ablation, and whether its
  bound is a floor: a task floor's value rises as the task is learnt, whatever its first points
  say), its logit mapped to a probability by isotonic regression on the logits of fits that did
  not see those runs (a linear logit alone was underconfident, most from 10% of the budget:
  plain-run clauses it gave 0.2-0.3 held 2% of the time), and a ridge model of the final value,
  with a split-conformal interval (the fit runs' absolute residuals' ``COVERAGE`` quantile, one
  for values of a finite range and one for the others, whose changes in ``scale`` units differ
  in size). The two make one predictive distribution of the final value
  (``headwise.forecast.predictive``): the regression's interval read as a normal's, conditioned
  on each verdict and mixed by the calibrated probability, so the forecast's value (its median)
  holds exactly when the probability is at least one half, and its interval is that
  distribution's; the probability stays the calibrated one. It records the range of the runs it
  was fit on (feature ranges, model sizes, tasks, per-head levers, clause kinds, plain or
  enforced); outside it the probability keeps ``OUTSIDE_SHRINK`` of its distance from 0.5, the
  regression's interval doubles, and the forecast says why (``ClauseForecast.outside``).
  Off-range forecasts of held-out specs were right less often than in-range ones (85-90% against
  90-94% from 10-40%), not half as often: keeping 0.8 of the distance scored within 0.004 of the
  best Brier score on them at each fraction.

``ClauseForecasters`` holds one forecaster per fraction with what the benchmark measured them
to do (``bench/forecasting/bench_clause_forecast.py --save`` writes the packaged file,
``headwise/data/clause_forecaster_v3.json``); it is plain JSON, and reading one never
unpickles.
"""

from __future__ import annotations

import json
import math
from collections.abc import Hashable, Sequence
from dataclasses import dataclass, field
from importlib import resources
from itertools import pairwise
from pathlib import Path
from statistics import NormalDist
from typing import Any

import torch
from torch import Tensor

from headwise.bounds import margin
from headwise.forecast.fitting import (
    check_ranges,
    conformal_quantile,
    finite_number,
    finite_vector,
    fitted_range,
    interpolate,
    isotonic,
    outside_range,
    ridge,
)
from headwise.forecast.predictive import VerdictMixture
from headwise.jsonfile import read_json_object

FORMAT = "headwise-clause-forecaster"
VERSION = "3"
PACKAGED = f"clause_forecaster_v{VERSION}.json"
MAX_BYTES = 1 << 20
BASE = ("margin_now", "margin_best", "margin_line", "slope", "held_share", "z_now")
KIND_FEATURES = ("task", "score", "ablation")  # the fitted indicators (ClauseKind.forecast_kind)
FEATURES = (*BASE, "enforced", *(f"{n}*enforced" for n in BASE),
            *(f"kind={k}" for k in KIND_FEATURES), "floor")
SQUASH = 3.0
L2 = 1e-3  # the logistic and ridge fits' penalty on standardised features
CALIBRATION_PRIOR = 1.0  # pseudo-outcomes per isotonic block, half held and half not
FOLDS = 5  # the calibration's cross-fitting folds
COVERAGE = 0.9  # the value interval's target coverage
Z_COVERAGE = NormalDist().inv_cdf(0.5 + COVERAGE / 2)  # a normal's central COVERAGE: +-Z sd
OUTSIDE_SHRINK = 0.8  # how much of its distance from 0.5 a probability keeps off-range


@dataclass(frozen=True)
class ClauseTrajectory:
    """One clause of one run: bounds, evaluation points and (when known) the outcome.

    ``values``/``stderrs``: the measured value and its standard error at each of ``steps``
    (``None`` where not measured); ``low``/``high``: the range the value can take (the clause
    kind's ``value_range``); ``context``: what the run was (``n_layers``, ``n_heads``,
    ``tasks``, ``levers``) and the clause's ``kind``, read against the forecaster's fitted
    range (the kind is a feature too).
    """

    steps: tuple[int, ...]
    values: tuple[float | None, ...]
    stderrs: tuple[float | None, ...]
    at_least: float | None
    at_most: float | None
    total_steps: int
    enforced: bool
    low: float
    high: float
    final: float | None = None
    holds: bool | None = None
    context: dict[str, Any] = field(default_factory=dict)

    @property
    def scale(self) -> float:
        """The unit margins are measured in: the value's range where it is finite (1 for role
        scores and accuracies), else the bound's size (a loss cap of 2.3 nats: 2.3)."""
        if math.isfinite(self.high - self.low):
            return self.high - self.low
        bound = self.at_least if self.at_least is not None else self.at_most
        return max(abs(bound or 0.0), 0.1)

    def margin(self, value: float) -> float:
        """Signed distance of ``value`` to the nearer bound in ``scale`` units (> 0: holds)."""
        return margin(value, self.at_least, self.at_most) / self.scale

    @property
    def value_bounds(self) -> tuple[float | None, float | None]:
        """The bounds on the measured value itself: the clause's, but for an exclusive
        clause's cap, which is on another quantity (its value is the listed tasks' smallest
        drop, its cap on the other tasks' largest)."""
        if self.context.get("kind") == "exclusive":
            return self.at_least, None
        return self.at_least, self.at_most

    def clip(self, value: float) -> float:
        """``value`` clipped to the range the measurement can take."""
        return min(max(value, self.low), self.high)

    def early(self, fraction: float) -> list[tuple[int, float, float | None]]:
        """The measured points at steps <= ``fraction`` of the budget (at least the first)."""
        pts = [(s, v, e) for s, v, e in zip(self.steps, self.values, self.stderrs, strict=True)
               if v is not None]
        cut = [p for p in pts if p[0] <= fraction * self.total_steps]
        return cut or pts[:1]


def _line_end(points: list[tuple[int, float, float | None]], total: int) -> tuple[float, float]:
    """(value at ``total``, slope per budget) of a least-squares line through ``points``, only
    their latest half from eight on (curves bend; few points are noisy); one point: flat."""
    tail = points[len(points) // 2:] if len(points) >= 8 else points
    if len(tail) < 2:
        return tail[-1][1], 0.0
    x = torch.tensor([p[0] / total for p in tail], dtype=torch.float64)
    y = torch.tensor([p[1] for p in tail], dtype=torch.float64)
    xm, ym = x.mean(), y.mean()
    slope = float(((x - xm) * (y - ym)).sum() / ((x - xm) ** 2).sum().clamp_min(1e-12))
    return float(ym + slope * (1.0 - xm)), slope


def features(traj: ClauseTrajectory, fraction: float) -> list[float]:
    """``FEATURES`` of the early points (see the module docstring)."""
    pts = traj.early(fraction)
    margins = [traj.margin(v) for _, v, _ in pts]
    end, slope = _line_end(pts, traj.total_steps)
    last_err = pts[-1][2]
    z = margins[-1] * traj.scale / last_err if last_err else 0.0
    base = [math.tanh(SQUASH * margins[-1]), math.tanh(SQUASH * max(margins)),
            math.tanh(SQUASH * traj.margin(traj.clip(end))), math.tanh(slope / traj.scale),
            sum(m >= 0 for m in margins) / len(margins), math.tanh(z / 3.0)]
    e = float(traj.enforced)
    kind = traj.context.get("kind")
    return [*base, e, *(v * e for v in base), *(float(kind == k) for k in KIND_FEATURES),
            float(traj.at_least is not None)]


def _logistic(z: Tensor, y: Tensor, l2: float) -> tuple[Tensor, float]:
    """(weights, bias) of an L2-penalised logistic regression of ``y`` on ``z`` (L-BFGS)."""
    w = torch.zeros(z.shape[1], dtype=torch.float64, requires_grad=True)
    b = torch.zeros(1, dtype=torch.float64, requires_grad=True)
    opt = torch.optim.LBFGS([w, b], max_iter=500, line_search_fn="strong_wolfe")

    def closure() -> Tensor:
        opt.zero_grad()
        loss = (torch.nn.functional.binary_cross_entropy_with_logits(z @ w + b, y)
                + l2 * (w ** 2).sum())
        loss.backward()
        return loss

    opt.step(closure)
    return w.detach(), float(b.detach())


def _cross_fitted_logits(z: Tensor, y: Tensor, groups: Sequence[Hashable], l2: float
                         ) -> Tensor:
    """Each row's logit under a fit on the rows of the other folds (``fit``'s docstring; a
    fold whose rest holds one outcome only gets the rest's smoothed log-odds)."""
    order = list(dict.fromkeys(groups))
    fold = {g: i % FOLDS for i, g in enumerate(order)}
    out = torch.empty(len(y), dtype=torch.float64)
    for k in sorted(set(fold.values())):
        held = torch.tensor([fold[h] == k for h in groups])
        rest = y[~held]
        if 0 < float(rest.sum()) < len(rest):
            w, b = _logistic(z[~held], rest, l2)
            out[held] = z[held] @ w + b
        else:
            share = (float(rest.sum()) + 0.5) / (len(rest) + 1)
            out[held] = math.log(share / (1 - share))
    return out


def _calibration(value: Any, where: str) -> tuple[list[float], list[float]]:
    """A file's ``calibration`` object back: knots ``logit`` (non-decreasing) and
    ``probability`` (non-decreasing, in [0, 1]), as many of each (``ValueError`` otherwise)."""
    expected = (f"{where}: expected {{logit: [...], probability: [...]}}: as many finite "
                "numbers each, both non-decreasing, probabilities in [0, 1]")
    if not isinstance(value, dict) or not isinstance(value.get("logit"), list):
        raise ValueError(expected)
    n = len(value["logit"])
    try:
        xs = finite_vector(value["logit"], n, where).tolist()
        ps = finite_vector(value.get("probability"), n, where).tolist()
    except ValueError:
        raise ValueError(expected) from None
    if (n == 0 or any(b < a for a, b in pairwise(xs)) or any(b < a for a, b in pairwise(ps))
            or not all(0.0 <= p <= 1.0 for p in ps)):
        raise ValueError(expected)
    return xs, ps


@dataclass(frozen=True)
class ClauseForecast:
    """A clause's forecast: the probability it holds at the end, its final value (the median
    of one predictive distribution with that probability, ``headwise.forecast.predictive``, so
    the value holds exactly when the probability is at least one half) with a ``COVERAGE``
    interval of the same distribution, whether that interval is the value's whole range (and
    so says nothing), and why the forecaster is outside its fitted range (if it is)."""

    probability: float
    value: float
    interval: tuple[float, float]
    outside: tuple[str, ...] = ()
    spans_range: bool = False

    @property
    def holds(self) -> bool:
        return self.probability >= 0.5

    def value_text(self) -> str:
        """The value and its interval as printed: ``0.97 [0.91, 1]``, or ``0.97 (its 90%
        interval is the whole range)``."""
        if self.spans_range:
            return f"{self.value:.3g} (its {COVERAGE:.0%} interval is the whole range)"
        return f"{self.value:.3g} [{self.interval[0]:.3g}, {self.interval[1]:.3g}]"


@dataclass
class ClauseForecaster:
    """One fraction's fitted models (see the module docstring)."""

    fraction: float
    mean: Tensor
    std: Tensor
    weight: Tensor
    bias: float
    calibration: tuple[list[float], list[float]]  # logit -> probability knots (``isotonic``)
    value_weight: Tensor
    value_bias: float
    residual: float  # clauses whose value has a finite range
    residual_open: float  # the others (losses, loss drops); ``residual`` if the fit had none
    ranges: dict[str, Any]

    @classmethod
    def fit(cls, trajectories: Sequence[ClauseTrajectory], fraction: float,
            groups: Sequence[Hashable] | None = None, l2: float = L2) -> ClauseForecaster:
        """Fit on trajectories with known outcomes (L2-penalised logistic regression by
        L-BFGS in float64, recalibrated by ``isotonic`` regression of the outcomes on the
        logits of fits that did not see them: ``groups`` labels each trajectory, the
        distinct labels are dealt to ``FOLDS`` folds in order of first appearance, and each
        fold's logits come from a fit on the others; ``None``: each trajectory its own
        group. Trajectories that are alike, one run's or one seed's, belong in one group,
        or the calibration learns from fits that saw their twins. Then a ridge regression
        of the final value's change, in ``scale`` units, from the latest early value)."""
        every = list(groups) if groups is not None else list(range(len(trajectories)))
        pairs = [(t, g) for t, g in zip(trajectories, every, strict=True)
                 if t.holds is not None and t.final is not None]
        known, labels = [t for t, _ in pairs], [g for _, g in pairs]
        if not known or len({t.holds for t in known}) < 2:
            raise ValueError("trajectories: expected outcomes of both kinds (some clauses "
                             "that hold and some that fail) to fit on")
        if len(set(labels)) < 2:
            raise ValueError("groups: expected at least two groups (the calibration fits on "
                             "some and reads the others)")
        x = torch.tensor([features(t, fraction) for t in known], dtype=torch.float64)
        y = torch.tensor([float(bool(t.holds)) for t in known], dtype=torch.float64)
        mean, std = x.mean(0), x.std(0).clamp_min(1e-6)
        z = (x - mean) / std
        w, b = _logistic(z, y, l2)
        calibration = isotonic(_cross_fitted_logits(z, y, labels, l2), y, CALIBRATION_PRIOR)
        change = torch.tensor([(float(t.final or 0.0) - t.early(fraction)[-1][1]) / t.scale
                               for t in known], dtype=torch.float64)
        design = torch.cat([z, torch.ones(len(known), 1, dtype=torch.float64)], 1)
        coef = ridge(design, change, l2)
        residuals = (design @ coef - change).abs()
        finite = torch.tensor([math.isfinite(t.high - t.low) for t in known])
        closed = conformal_quantile(residuals[finite] if bool(finite.any()) else residuals,
                                    COVERAGE)
        open_ = (conformal_quantile(residuals[~finite], COVERAGE) if bool((~finite).any())
                 else closed)
        ranges = {**fitted_range(FEATURES, x, [t.context for t in known],
                                 [t.enforced for t in known]),
                  "kinds": sorted({str(t.context.get("kind")) for t in known})}
        return cls(fraction, mean, std, w, b, calibration, coef[:-1], float(coef[-1]),
                   closed, open_, ranges)

    def forecast(self, traj: ClauseTrajectory) -> ClauseForecast:
        """The forecast from ``traj``'s points in the first ``fraction`` of its budget."""
        x = torch.tensor(features(traj, self.fraction), dtype=torch.float64)
        z = (x - self.mean) / self.std
        p = interpolate(*self.calibration, float(z @ self.weight + self.bias))
        outside = self.outside(traj, x)
        if outside:
            p = 0.5 + (p - 0.5) * OUTSIDE_SHRINK
        now = traj.early(self.fraction)[-1][1]
        mu = now + traj.scale * float(z @ self.value_weight + self.value_bias)
        residual = self.residual if math.isfinite(traj.high - traj.low) else self.residual_open
        half = traj.scale * residual * (1.0 if not outside else 2.0)
        mixture = VerdictMixture(p, mu, max(half, 1e-9 * traj.scale) / Z_COVERAGE,
                                 *traj.value_bounds, traj.low, traj.high)
        interval = (mixture.quantile((1 - COVERAGE) / 2), mixture.quantile((1 + COVERAGE) / 2))
        return ClauseForecast(mixture.effective_probability(), mixture.median(), interval,
                              tuple(outside), interval == (traj.low, traj.high))

    def outside(self, traj: ClauseTrajectory, x: Tensor | None = None) -> list[str]:
        """Why ``traj`` lies outside the runs this forecaster was fit on (empty: inside)."""
        values = (torch.tensor(features(traj, self.fraction)) if x is None else x).tolist()
        why = outside_range(self.ranges, FEATURES, values, values, traj.context, traj.enforced)
        kind = traj.context.get("kind")
        if kind is not None and str(kind) not in self.ranges["kinds"]:
            why.append(f"clause kind {kind} not in the fitted runs")
        return why

    def to_dict(self) -> dict[str, Any]:
        return {"fraction": self.fraction, "mean": self.mean.tolist(), "std": self.std.tolist(),
                "weight": self.weight.tolist(), "bias": self.bias,
                "calibration": {"logit": self.calibration[0],
                                "probability": self.calibration[1]},
                "value_weight": self.value_weight.tolist(), "value_bias": self.value_bias,
                "residual": self.residual, "residual_open": self.residual_open,
                "ranges": self.ranges}

    @classmethod
    def from_dict(cls, d: Any, where: str) -> ClauseForecaster:
        """``to_dict``'s output back (``ValueError`` naming ``where`` and the field)."""
        if not isinstance(d, dict):
            raise ValueError(f"{where}: expected an object")
        vectors = {key: finite_vector(d.get(key), len(FEATURES), f"{where}.{key}")
                   for key in ("mean", "std", "weight", "value_weight")}
        if not bool((vectors["std"] > 0).all()):
            raise ValueError(f"{where}.std: expected scales > 0")
        numbers = {key: finite_number(d.get(key), f"{where}.{key}")
                   for key in ("fraction", "bias", "value_bias", "residual", "residual_open")}
        return cls(numbers["fraction"], vectors["mean"], vectors["std"], vectors["weight"],
                   numbers["bias"], _calibration(d.get("calibration"), f"{where}.calibration"),
                   vectors["value_weight"], numbers["value_bias"],
                   numbers["residual"], numbers["residual_open"],
                   check_ranges(d.get("ranges"), f"{where}.ranges", FEATURES,
                                ("tasks", "kinds", "modes")))


@dataclass(frozen=True)
class ClauseForecasters:
    """Forecasters fit at several fractions of the budget, and what the benchmark measured
    them to do on runs they were not fit on (``measured``, quoted with their forecasts)."""

    models: tuple[ClauseForecaster, ...]
    measured: dict[str, Any] = field(default_factory=dict)

    def at(self, seen: float) -> ClauseForecaster:
        """The model for a run ``seen`` of the way through its budget: the one fit at the
        largest fraction not past it (before the first: the first)."""
        fits = sorted(self.models, key=lambda m: m.fraction)
        return next((m for m in reversed(fits) if m.fraction <= seen + 1e-9), fits[0])

    def to_json(self) -> str:
        return json.dumps({"format": FORMAT, "version": VERSION, "features": list(FEATURES),
                           "models": [m.to_dict() for m in self.models],
                           "measured": self.measured}, indent=1)

    @classmethod
    def from_json(cls, text: str, where: str = "clause forecaster") -> ClauseForecasters:
        """Read ``to_json``'s output back: plain JSON, never unpickled (``ValueError`` naming
        ``where`` and the field on anything else)."""
        try:
            d = json.loads(text)
        except json.JSONDecodeError as e:
            raise ValueError(f"{where}: not JSON ({e})") from None
        return cls.from_dict(d, where)

    @classmethod
    def from_dict(cls, d: Any, where: str) -> ClauseForecasters:
        """``to_json``'s object back (``ValueError`` naming ``where`` and the field)."""
        if not isinstance(d, dict) or d.get("format") != FORMAT:
            raise ValueError(f"{where}: format: expected {FORMAT!r}")
        if str(d.get("version")) != VERSION or d.get("features") != list(FEATURES):
            raise ValueError(f"{where}: version/features: expected {VERSION!r} with "
                             f"{list(FEATURES)}")
        models = d.get("models")
        if not isinstance(models, list) or not models:
            raise ValueError(f"{where}: models: expected a non-empty list")
        measured = d.get("measured", {})
        if not isinstance(measured, dict):
            raise ValueError(f"{where}: measured: expected an object")
        return cls(tuple(ClauseForecaster.from_dict(m, f"{where}: models[{i}]")
                         for i, m in enumerate(models)), measured)


def load_clause_forecasters(path: str | Path | None = None) -> ClauseForecasters:
    """The clause forecasters in the JSON file ``path`` (``None``: the packaged ones)."""
    if path is None:
        text = resources.files("headwise.data").joinpath(PACKAGED).read_text("utf-8")
        return ClauseForecasters.from_json(text, f"headwise/data/{PACKAGED}")
    return ClauseForecasters.from_dict(read_json_object(Path(path), ValueError, MAX_BYTES),
                                       str(path))
