"""Forecasts of each head's final role scores with intervals: role forecasts that say when
they do not know.

From the first checkpoints of a run, for every head and candidate role
(``TOP_ROLE_CANDIDATES``): the role's final score, by ridge regression of its change from the
latest score on ``FEATURES`` (the role forecaster's per-role signals, ``ROLE_FEATURES``, with
the share of training ``seen`` and whether the run ``enforced`` a contract), and a
``COVERAGE`` interval around it. The interval is cross-conformal: the runs a forecaster is
fit on are split into ``FOLDS`` groups, each group is forecast by a fit on the others, and
the ``COVERAGE`` quantile of those errors, in units of ``(1 - seen) / seen + FLOOR`` (how far
a line through the points seen so far is carried, over how much it rests on), is taken per
band of ``seen`` (``SEEN_BANDS``): early forecasts are less certain, and within a band the
interval still narrows as the run goes on.

The head's forecast role is the role table's rule applied to the forecast scores (the top
role, ``none`` below ``SHOWN_MIN_SCORE``). It is **undecided** when the intervals leave it
open: the forecast role's interval straddles the threshold, another role's interval reaches
above the forecast role's lower end (the top role could change), or, for ``none``, some
role's interval reaches the threshold.

The forecaster records the range of runs it was fit on (model sizes, tasks, plain or
enforced, feature ranges); outside it every interval is doubled (so more heads read
undecided) and the forecast says why. ``RoleScoreForecaster`` is plain JSON with what the
benchmark measured it to do (``bench/forecasting/bench_role_scores.py --save`` writes the packaged
``headwise/data/role_score_forecaster_v1.json``); reading one never unpickles.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from headwise.analysis.role_table import SHOWN_MIN_SCORE, TOP_ROLE_CANDIDATES
from headwise.analysis.trajectories import Trajectory
from headwise.forecast.fitting import (
    check_ranges,
    checked_measured,
    conformal_quantile,
    finite_number,
    finite_vector,
    fitted_range,
    outside_range,
    ridge,
)
from headwise.forecast.roles import ROLE_FEATURES, candidate_values, early_features
from headwise.heads import Head
from headwise.jsonfile import read_json_object

FORMAT = "headwise-role-score-forecaster"
VERSION = "1"
PACKAGED = f"role_score_forecaster_v{VERSION}.json"
MAX_BYTES = 1 << 20
FEATURES = (*ROLE_FEATURES, "seen", "enforced")
COVERAGE = 0.9
FOLDS = 5
SEEN_BANDS = (0.0, 0.15, 0.3, 0.5, 0.75, 1.0)  # upper edges close each band; the first is (0, 0.15]
OUTSIDE_WIDEN = 2.0
FLOOR = 0.5  # the error scale at the end: what noise leaves when nothing is left to extrapolate


def _scale(seen: Tensor) -> Tensor:
    """The unit errors are measured in: the training still to come over the training seen
    (an extrapolated line's error grows with both), floored."""
    return (1.0 - seen) / seen.clamp_min(1e-3) + FLOOR


@dataclass(frozen=True)
class RoleRun:
    """A run's role-score trajectory with what the forecaster conditions on: its budget
    (``total_steps``; ``None``: the trajectory's last step), whether it enforced a contract,
    and ``context`` (``n_layers``, ``n_heads``, ``tasks``) read against the fitted range."""

    traj: Trajectory
    total_steps: int | None = None
    enforced: bool = False
    context: dict[str, Any] = field(default_factory=dict)

    @property
    def budget(self) -> int:
        return int(self.total_steps if self.total_steps is not None else self.traj.steps[-1])


@dataclass(frozen=True)
class RoleScoreForecast:
    """One head's forecast: per role ``(score, low, high)``, the forecast role, whether the
    intervals decide it, and why the forecaster is off its fitted range (empty: inside)."""

    head: Head
    scores: dict[str, tuple[float, float, float]]
    role: str
    decided: bool
    outside: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        return {"head": str(self.head), "role": self.role, "decided": self.decided,
                "scores": {r: {"value": v, "interval": [lo, hi]}
                           for r, (v, lo, hi) in self.scores.items()},
                "outside": list(self.outside)}

    def text(self) -> str:
        """``"induction 0.62 (0.48 to 0.76)"``, ``"none"`` or ``"undecided: ..."``."""
        if self.role == "none":
            best = max(self.scores.items(), key=lambda kv: kv[1][0], default=None)
            shown = "none" if best is None else (
                f"none (best {best[0]} {best[1][0]:.2f}, {best[1][1]:.2f} to {best[1][2]:.2f})")
        else:
            v, lo, hi = self.scores[self.role]
            shown = f"{self.role} {v:.2f} ({lo:.2f} to {hi:.2f})"
        return shown if self.decided else f"undecided: {shown}"


def decide(scores: dict[str, tuple[float, float, float]],
           threshold: float = SHOWN_MIN_SCORE) -> tuple[str, bool]:
    """The forecast role of per-role ``(score, low, high)`` and whether the intervals decide
    it (see the module docstring). With no defined score the head shows ``none`` whatever
    happens (no role can reach the threshold), so that is decided."""
    if not scores:
        return "none", True
    top = max(scores, key=lambda r: scores[r][0])
    value, low, _ = scores[top]
    if value < threshold:
        return "none", all(hi < threshold for _, _, hi in scores.values())
    rivals = [hi for r, (_, _, hi) in scores.items() if r != top]
    return top, low >= threshold and all(hi < low for hi in rivals)


def _rows(run: RoleRun, n: int) -> tuple[Tensor, Tensor, Tensor]:
    """(N, R, F) features, (N, R) latest scores and (N, R) whether the role is defined now,
    from the first ``n`` checkpoints."""
    f = early_features(run.traj, n, run.budget)
    N, R, _ = f.roles.shape
    seen = f.none[:, -1:, None].expand(N, R, 1)
    enforced = torch.full((N, R, 1), float(run.enforced), dtype=torch.float64)
    now = candidate_values(run.traj)[n - 1]
    return torch.cat([f.roles, seen, enforced], -1), torch.nan_to_num(now), ~torch.isnan(now)


def _band(seen: Tensor) -> Tensor:
    """The ``SEEN_BANDS`` band index of each ``seen`` value."""
    edges = torch.tensor(SEEN_BANDS[1:-1], dtype=torch.float64)
    return torch.bucketize(seen.contiguous(), edges, right=False)


def _training_rows(runs: Sequence[RoleRun]) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """Every (head, role) with a defined score now and at the end, at every prefix of >= 2
    checkpoints short of the last of every run (a run seen to its end needs no forecast):
    features (M, F), change to the final score (M,), ``seen`` (M,) and the run's index (M,)."""
    xs, ys, runs_of = [], [], []
    for i, run in enumerate(runs):
        final = candidate_values(run.traj)[-1]  # (N, R)
        for n in range(2, len(run.traj.steps)):
            x, now, defined = _rows(run, n)
            ok = defined & ~torch.isnan(final)
            xs.append(x[ok])
            ys.append((final - now)[ok])
            runs_of.append(torch.full((int(ok.sum()),), i))
    x = torch.cat(xs)
    return x, torch.cat(ys), x[:, FEATURES.index("seen")], torch.cat(runs_of)


@dataclass
class RoleScoreForecaster:
    """Fitted ridge weights, per-band conformal half-widths, the fitted range and the
    benchmark's measurement (see the module docstring)."""

    mean: Tensor
    std: Tensor
    weight: Tensor
    bias: float
    half_widths: tuple[float, ...]  # per band of SEEN_BANDS, in units of _scale(seen)
    ranges: dict[str, Any]
    measured: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def fit(cls, runs: Sequence[RoleRun], l2: float = 1e-2) -> RoleScoreForecaster:
        """Fit on finished runs (each read as ending at its last checkpoint): ridge on every
        prefix of >= 2 checkpoints short of the end, half-widths cross-conformal over
        ``FOLDS`` groups of runs (fewer with fewer runs).

        Raises:
            ValueError: fewer than 2 runs, or a run with fewer than 3 checkpoints.
        """
        if len(runs) < 2:
            raise ValueError(f"runs: got {len(runs)}, expected at least 2 (the interval is "
                             "measured on runs held out of the fit)")
        for i, run in enumerate(runs):
            if len(run.traj.steps) < 3:
                raise ValueError(f"runs[{i}]: {len(run.traj.steps)} checkpoint(s), expected "
                                 "at least 3 (a forecast from 2 and the end)")
        x, y, seen, run_of = _training_rows(runs)
        folds = min(FOLDS, len(runs))
        errors = torch.empty_like(y)
        for k in range(folds):
            held = run_of % folds == k
            model = cls._fit_point(x[~held], y[~held], l2)
            errors[held] = (model._predict(x[held]) - y[held]).abs() / _scale(seen[held])
        bands = _band(seen)
        overall = conformal_quantile(errors, COVERAGE)
        widths = tuple(conformal_quantile(errors[bands == b], COVERAGE)
                       if bool((bands == b).any()) else overall
                       for b in range(len(SEEN_BANDS) - 1))
        out = cls._fit_point(x, y, l2)
        out.half_widths = widths
        out.ranges = fitted_range(FEATURES, x, [r.context for r in runs],
                                  [r.enforced for r in runs])
        return out

    @classmethod
    def _fit_point(cls, x: Tensor, y: Tensor, l2: float) -> RoleScoreForecaster:
        mean, std = x.mean(0), x.std(0).clamp_min(1e-6)
        design = torch.cat([(x - mean) / std, torch.ones(len(x), 1, dtype=x.dtype)], 1)
        coef = ridge(design, y, l2)
        return cls(mean, std, coef[:-1], float(coef[-1]), (), {})

    def _predict(self, x: Tensor) -> Tensor:
        return ((x - self.mean) / self.std) @ self.weight + self.bias

    def forecast(self, run: RoleRun, n: int) -> list[RoleScoreForecast]:
        """Every head's forecast from the first ``n`` checkpoints of ``run`` (at least 2:
        ``ValueError`` for a run with fewer)."""
        if len(run.traj.steps) < 2:
            raise ValueError(f"run: {len(run.traj.steps)} checkpoint(s), expected at least 2 "
                             "(a forecast reads a change)")
        n = max(2, min(n, len(run.traj.steps)))
        x, now, defined = _rows(run, n)
        at = x[:1, 0, FEATURES.index("seen")]
        unit = float(_scale(at))
        value = (now + self._predict(x)).clamp(0.0, 1.0)  # (N, R)
        outside = tuple(self.outside(run, x[defined]))
        half = self.half_widths[int(_band(at))] * unit
        half *= OUTSIDE_WIDEN if outside else 1.0
        out = []
        for i, head in enumerate(run.traj.heads):
            scores = {r: (float(value[i, j]), max(0.0, float(value[i, j]) - half),
                          min(1.0, float(value[i, j]) + half))
                      for j, r in enumerate(TOP_ROLE_CANDIDATES) if bool(defined[i, j])}
            role, decided = decide(scores)
            out.append(RoleScoreForecast(head, scores, role, decided, outside))
        return out

    def outside(self, run: RoleRun, x: Tensor) -> list[str]:
        """Why ``run`` (its feature rows ``x``) lies outside the fitted runs (empty: inside)."""
        if len(x):
            low, high = x.min(0).values.tolist(), x.max(0).values.tolist()
        else:  # no defined score: only the run itself can be off-range
            low = high = [self.ranges["features"][n][0] for n in FEATURES]
        return outside_range(self.ranges, FEATURES, low, high, run.context, run.enforced)

    def to_json(self) -> str:
        return json.dumps({
            "format": FORMAT, "version": VERSION, "features": list(FEATURES),
            "roles": list(TOP_ROLE_CANDIDATES), "seen_bands": list(SEEN_BANDS),
            "coverage": COVERAGE, "mean": self.mean.tolist(), "std": self.std.tolist(),
            "weight": self.weight.tolist(), "bias": self.bias,
            "half_widths": list(self.half_widths), "ranges": self.ranges,
            "measured": self.measured}, indent=1)

    @classmethod
    def from_dict(cls, d: Any, where: str) -> RoleScoreForecaster:
        """``to_json``'s object back (``ValueError`` naming ``where`` and the field)."""
        if not isinstance(d, dict) or d.get("format") != FORMAT:
            raise ValueError(f"{where}: format: expected {FORMAT!r}")
        if (d.get("version") != VERSION or d.get("features") != list(FEATURES)
                or d.get("roles") != list(TOP_ROLE_CANDIDATES)
                or d.get("seen_bands") != list(SEEN_BANDS) or d.get("coverage") != COVERAGE):
            raise ValueError(f"{where}: version/features/roles/seen_bands/coverage: expected "
                             f"{VERSION!r} with {list(FEATURES)}, {list(TOP_ROLE_CANDIDATES)}, "
                             f"{list(SEEN_BANDS)}, {COVERAGE}")
        vectors = {key: finite_vector(d.get(key), size, f"{where}: {key}")
                   for key, size in (("mean", len(FEATURES)), ("std", len(FEATURES)),
                                     ("weight", len(FEATURES)),
                                     ("half_widths", len(SEEN_BANDS) - 1))}
        if not bool((vectors["std"] > 0).all()) or not bool((vectors["half_widths"] >= 0).all()):
            raise ValueError(f"{where}: std/half_widths: expected scales > 0 and widths >= 0")
        bias = finite_number(d.get("bias"), f"{where}: bias")
        measured = checked_measured(d.get("measured", {}), measured_text_scores,
                                    f"{where}: measured", "the benchmark's numbers")
        return cls(vectors["mean"], vectors["std"], vectors["weight"], bias,
                   tuple(vectors["half_widths"].tolist()),
                   check_ranges(d.get("ranges"), f"{where}: ranges", FEATURES),
                   measured)


def load_role_score_forecaster(path: str | Path | None = None) -> RoleScoreForecaster:
    """The forecaster in the JSON file ``path`` (``None``: the packaged one). Plain JSON only."""
    if path is None:
        text = resources.files("headwise.data").joinpath(PACKAGED).read_text("utf-8")
        return RoleScoreForecaster.from_dict(json.loads(text), f"headwise/data/{PACKAGED}")
    return RoleScoreForecaster.from_dict(read_json_object(Path(path), ValueError, MAX_BYTES),
                                         str(path))


def measured_text_scores(measured: dict[str, Any]) -> str:
    """One sentence quoting what the benchmark measured the score forecaster to do on fresh
    runs it was not fit on (empty record: says so)."""
    fresh = measured.get("fresh")
    if not fresh:
        return "no benchmark measurement recorded for this score forecaster"
    return (f"score forecasts from the first {measured['fraction']:.0%} of checkpoints, on "
            f"{fresh['heads']} heads of fresh runs: decided on {fresh['decided']:.1%}, right "
            f"on {fresh['decided_accuracy']:.1%} of those (the role forecaster's most "
            f"confident forecasts, as many heads: {fresh['v2_most_confident']:.1%}); final "
            f"scores inside their 90% intervals {fresh['coverage']:.1%} "
            f"({measured.get('doc', 'docs/benchmarks.md')})")
