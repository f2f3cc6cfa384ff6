"""Forecasts of heads' final roles from early checkpoints: the linear baseline and a fitted model.

Both read the first checkpoints of a ``Trajectory`` (scored by the role-table function) and
predict each head's final top role among ``CLASSES`` (the table's top-role candidates and
``"none"``, with the table's shown threshold ``SHOWN_MIN_SCORE``):

- ``linear_forecast`` (baseline): a least-squares line per role score through the early
  checkpoints, extrapolated to the last step and clipped to [0, 1]; the top role of those
  values, ``"none"`` below the threshold.
- ``Forecaster``: a conditional-logit model (logistic regression with one weight vector
  shared by the roles, no per-role bias) on early signals (``early_features``: each role's
  latest score, its change, its slope projected to the end, its linear extrapolation, whether
  it leads now or in the extrapolation and by how much, and the share of training seen). Its
  weights are small versioned JSON in the package (``headwise/data/forecaster_v2.json``,
  written by ``bench/forecasting/bench_forecast.py``) together with the accuracy the benchmark
  measured on held-out runs; loading never unpickles.

Training signals (``headwise.analysis.forecast_signals``: the loss curve and each head's
gradient alignment with each role, in pattern and in parameter space) and commitment were
scored as extra features by the benchmark (``--ablation``) and did not improve held-out
accuracy, so the packaged forecaster does not read them (docs/benchmarks.md).
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from headwise.analysis.role_table import SHOWN_MIN_SCORE, TOP_ROLE_CANDIDATES
from headwise.analysis.trajectories import Trajectory
from headwise.forecast.fitting import checked_measured, finite_vector
from headwise.heads import Head
from headwise.jsonfile import read_json_object

CLASSES = (*TOP_ROLE_CANDIDATES, "none")
# The packaged forecaster's version; files of other versions are refused. v2 has v1's features,
# refit on the benchmark's runs scored with the unified role definitions (v1's runs predate them).
VERSION = "2"
FORECASTER_FILE = f"forecaster_v{VERSION}.json"
FORMAT = "headwise-forecaster"
MAX_FORECASTER_BYTES = 1 << 20  # the packaged file is a few kilobytes


def n_early(n_checkpoints: int, fraction: float) -> int:
    """Checkpoints in the first ``fraction`` of a trajectory: ``ceil(fraction * C)``, >= 2."""
    if not 0.0 < fraction <= 1.0:
        raise ValueError(f"fraction: got {fraction}, expected a number in (0, 1]")
    return min(n_checkpoints, max(2, math.ceil(fraction * n_checkpoints)))


def candidate_values(traj: Trajectory) -> Tensor:
    """(C, N, 6) scores of the candidate roles; NaN where undefined or not scored."""
    C, N = len(traj.steps), len(traj.heads)
    out = torch.full((C, N, len(TOP_ROLE_CANDIDATES)), math.nan, dtype=torch.float64)
    for j, role in enumerate(TOP_ROLE_CANDIDATES):
        if role in traj.roles:
            out[:, :, j] = traj.values[:, :, traj.roles.index(role)]
    return out


def fit_lines(x: Tensor, y: Tensor) -> tuple[Tensor, Tensor]:
    """Least-squares lines through ``(x, y[:, n, r])`` ignoring NaN: (intercept, slope) (N, R).

    x (C,), y (C, N, R). A series with one point gets slope 0; none gets NaN.
    """
    ok = ~torch.isnan(y)
    w = ok.to(y.dtype)
    n = w.sum(0)  # (N, R)
    xs = x[:, None, None].expand_as(y)
    yz = torch.where(ok, y, torch.zeros_like(y))
    xm = (xs * w).sum(0) / n.clamp_min(1)
    ym = (yz * w).sum(0) / n.clamp_min(1)
    var = (((xs - xm) ** 2) * w).sum(0)
    cov = ((xs - xm) * (yz - ym) * w).sum(0)
    slope = torch.where(var > 0, cov / var.clamp_min(1e-300), torch.zeros_like(var))
    intercept = ym - slope * xm
    nan = torch.full_like(intercept, math.nan)
    return torch.where(n > 0, intercept, nan), torch.where(n > 0, slope, nan)


def _top(values: Tensor, min_score: float) -> list[str]:
    """Per row of (N, R) candidate values, the top role (NaN never wins; ``none`` below)."""
    out = []
    for row in values:
        filled = torch.where(torch.isnan(row), torch.full_like(row, -math.inf), row)
        j = int(filled.argmax())
        out.append(TOP_ROLE_CANDIDATES[j] if float(filled[j]) >= min_score else "none")
    return out


def linear_forecast(traj: Trajectory, n: int, total_steps: int | None = None,
                    min_score: float = SHOWN_MIN_SCORE) -> list[str]:
    """Baseline: each head's final role from its first ``n`` checkpoints (see module).

    Args:
        traj: the trajectory (only its first ``n`` checkpoints are read).
        n: checkpoints to use (at least 1).
        total_steps: the step to extrapolate to (default: the trajectory's last step).
        min_score: the role table's threshold.
    """
    n = max(1, min(n, len(traj.steps)))
    end = float(total_steps if total_steps is not None else traj.steps[-1])
    x = torch.tensor(traj.steps[:n], dtype=torch.float64)
    a, b = fit_lines(x, candidate_values(traj)[:n])
    return _top((a + b * end).clamp(0.0, 1.0), min_score)


ROLE_FEATURES = ("last", "change", "gain", "linear", "recent", "top_now", "top_linear",
                 "lead_last", "lead_linear", "lead_recent", "defined")
NONE_FEATURES = ("top_score", "top_linear_score", "none_now", "none_linear", "seen")


@dataclass(frozen=True)
class EarlyFeatures:
    """Early signals of N heads: ``roles`` (N, R, len(ROLE_FEATURES)) for each candidate role,
    ``none`` (N, len(NONE_FEATURES)) for the ``none`` class."""

    roles: Tensor
    none: Tensor

    @staticmethod
    def cat(parts: Sequence[EarlyFeatures]) -> EarlyFeatures:
        return EarlyFeatures(torch.cat([p.roles for p in parts]),
                             torch.cat([p.none for p in parts]))


def onehot(tops: list[str]) -> Tensor:
    """(N, R) 1 where the candidate role is the head's top role."""
    return torch.tensor([[float(t == r) for r in TOP_ROLE_CANDIDATES] for t in tops],
                        dtype=torch.float64)


def lead(v: Tensor) -> Tensor:
    """(N, R) each role's margin over the best other role of ``v`` (N, R)."""
    two = v.topk(2, dim=1).values
    best_other = torch.where(v >= two[:, :1], two[:, 1:2], two[:, :1])
    return v - best_other


def early_features(traj: Trajectory, n: int, total_steps: int | None = None,
                   min_score: float = SHOWN_MIN_SCORE) -> EarlyFeatures:
    """Early signals of every head from the first ``n`` checkpoints.

    Steps are read as fractions of ``total_steps`` (default: the last step), so runs of
    different lengths share one scale. Per candidate role (``ROLE_FEATURES``): the ``last``
    score, its ``change`` since the first checkpoint, ``gain`` (slope x remaining fraction,
    clipped to [-1, 1]), ``linear`` (the baseline's clipped extrapolation), ``recent`` (the
    slope of the last two checkpoints extrapolated, clipped), whether the role is the top role
    now / of the extrapolation (``top_now``, ``top_linear``), its lead over the best other role
    now and extrapolated (``lead_last``, ``lead_linear``, ``lead_recent``) and whether it is
    defined. For ``none`` (``NONE_FEATURES``): the best score now and extrapolated, whether the
    head shows ``none`` now / in the extrapolation, and the share of training ``seen``.
    Undefined scores read 0.
    """
    n = max(1, min(n, len(traj.steps)))
    total = float(total_steps if total_steps is not None else traj.steps[-1])
    x = torch.tensor(traj.steps[:n], dtype=torch.float64) / total  # (n,)
    y = candidate_values(traj)[:n]  # (n, N, R)
    a, b = fit_lines(x, y)
    seen = float(x[-1])
    z = torch.nan_to_num
    last = z(y[-1])
    linear = z((a + b).clamp(0.0, 1.0))
    top_now, top_lin = _top(y[-1], min_score), _top(a + b, min_score)
    # the latest slope (last two checkpoints) carried to the end: saturating curves flatten
    step_slope = (y[-1] - y[-2]) / (x[-1] - x[-2]) if n >= 2 else torch.zeros_like(y[-1])
    recent = z((y[-1] + step_slope * (1.0 - seen)).clamp(0.0, 1.0))
    roles = torch.stack([last, z(y[-1] - y[0]), z(b * (1.0 - seen)).clamp(-1.0, 1.0), linear,
                         recent, onehot(top_now), onehot(top_lin), lead(last), lead(linear),
                         lead(recent), (~torch.isnan(y[-1])).to(torch.float64)],
                        dim=-1)  # (N, R, Fr)
    none = torch.stack([last.max(1).values, linear.max(1).values,
                        torch.tensor([float(t == "none") for t in top_now], dtype=torch.float64),
                        torch.tensor([float(t == "none") for t in top_lin], dtype=torch.float64),
                        torch.full((last.shape[0],), seen, dtype=torch.float64)], dim=-1)
    return EarlyFeatures(roles, none)


@dataclass
class Forecaster:
    """A conditional-logit model over ``CLASSES``, symmetric in the roles.

    Role ``r``'s logit is ``w . z_r`` (``z_r``: the role's standardised ``ROLE_FEATURES``; one
    weight vector and no per-role bias, so what is learnt about one role carries to roles that
    are rare or absent in the fitted runs); ``none``'s logit is ``v . z_none + c``; the
    probabilities are their softmax. ``measured`` holds what the benchmark measured on held-out
    runs (accuracy, fraction, command), quoted by reports.
    """

    version: str
    role_mean: Tensor  # (Fr,)
    role_std: Tensor  # (Fr,)
    role_weight: Tensor  # (Fr,)
    none_mean: Tensor  # (Fn,)
    none_std: Tensor  # (Fn,)
    none_weight: Tensor  # (Fn,)
    none_bias: Tensor  # (1,)
    measured: dict[str, Any] = field(default_factory=dict)

    def probabilities(self, feats: EarlyFeatures) -> Tensor:
        """(N, K) class probabilities, classes in ``CLASSES`` order."""
        return torch.softmax(self._logits(feats, self.role_weight, self.none_weight,
                                          self.none_bias), dim=-1)

    def _logits(self, f: EarlyFeatures, w: Tensor, v: Tensor, c: Tensor) -> Tensor:
        zr = (f.roles - self.role_mean) / self.role_std  # (N, R, Fr)
        zn = (f.none - self.none_mean) / self.none_std  # (N, Fn)
        return torch.cat([zr @ w, (zn @ v + c)[:, None]], dim=1)  # (N, R + 1)

    def predict(self, traj: Trajectory, n: int, total_steps: int | None = None
                ) -> list[tuple[str, float]]:
        """Per head: (predicted final role, its probability) from the first ``n`` checkpoints."""
        p = self.probabilities(early_features(traj, n, total_steps))
        conf, idx = p.max(dim=1)
        return [(CLASSES[int(i)], float(c)) for i, c in zip(idx, conf, strict=True)]

    @classmethod
    def fit(cls, feats: EarlyFeatures, labels: Sequence[str], version: str, l2: float = 1e-3,
            measured: dict[str, Any] | None = None) -> Forecaster:
        """Fit on M heads' features and final roles (L2 on the weights, L-BFGS, float64)."""
        y = torch.tensor([CLASSES.index(c) for c in labels])
        flat = feats.roles.reshape(-1, feats.roles.shape[-1])
        f = cls(version, flat.mean(0), flat.std(0).clamp_min(1e-6), torch.empty(0),
                feats.none.mean(0), feats.none.std(0).clamp_min(1e-6), torch.empty(0),
                torch.empty(0), dict(measured or {}))
        dt = torch.float64
        # sized by the features given, so the benchmark can fit on other feature sets too
        w = torch.zeros(feats.roles.shape[-1], dtype=dt, requires_grad=True)
        v = torch.zeros(feats.none.shape[-1], dtype=dt, requires_grad=True)
        c = torch.zeros(1, dtype=dt, requires_grad=True)
        opt = torch.optim.LBFGS([w, v, c], max_iter=500, line_search_fn="strong_wolfe")

        def closure() -> Tensor:
            opt.zero_grad()
            loss = (torch.nn.functional.cross_entropy(f._logits(feats, w, v, c), y)
                    + l2 * ((w ** 2).sum() + (v ** 2).sum()))
            loss.backward()
            return loss

        opt.step(closure)
        f.role_weight = w.detach()
        f.none_weight, f.none_bias = v.detach(), c.detach()
        return f

    def to_json(self) -> str:
        """The forecaster as JSON (``load_forecaster`` reads it back)."""
        return json.dumps({
            "format": FORMAT, "version": self.version, "classes": list(CLASSES),
            "role_features": list(ROLE_FEATURES), "none_features": list(NONE_FEATURES),
            **{k: getattr(self, k).tolist() for k in _TENSORS}, "measured": self.measured},
            indent=1)


_TENSORS = ("role_mean", "role_std", "role_weight", "none_mean", "none_std", "none_weight",
            "none_bias")


def load_forecaster(path: str | Path | None = None) -> Forecaster:
    """Read a forecaster from JSON (default: the one packaged with headwise). Plain JSON only.

    Raises:
        ValueError: not a regular file of at most ``MAX_FORECASTER_BYTES`` holding a JSON
            object, not a forecaster file, one of another version, or one made for other
            classes or features, with mis-shaped, non-finite or zero-scale weights, or whose
            ``measured`` record lacks what ``measured_text`` quotes (every message starts with
            the file).
    """
    if path is None:
        text = resources.files("headwise.data").joinpath(FORECASTER_FILE).read_text("utf-8")
        where = f"headwise/data/{FORECASTER_FILE}"
        d = json.loads(text)
    else:
        where = str(path)
        d = read_json_object(Path(path), ValueError, MAX_FORECASTER_BYTES)
    if d.get("format") != FORMAT:
        raise ValueError(f"{where}: format: expected {FORMAT!r}")
    if str(d.get("version")) != VERSION:
        raise ValueError(f"{where}: version: got {d.get('version')!r}, expected {VERSION!r} "
                         f"(the forecaster this headwise was benchmarked with)")
    if (d.get("classes") != list(CLASSES) or d.get("role_features") != list(ROLE_FEATURES)
            or d.get("none_features") != list(NONE_FEATURES)):
        raise ValueError(f"{where}: classes/role_features/none_features: expected "
                         f"{list(CLASSES)}, {list(ROLE_FEATURES)}, {list(NONE_FEATURES)}")
    fr, fn = len(ROLE_FEATURES), len(NONE_FEATURES)
    sizes = {"role_mean": fr, "role_std": fr, "role_weight": fr, "none_mean": fn,
             "none_std": fn, "none_weight": fn, "none_bias": 1}
    t = {k: finite_vector(d.get(k), n, f"{where}: {k}") for k, n in sizes.items()}
    for k in ("role_std", "none_std"):
        if not bool((t[k] > 0).all()):
            raise ValueError(f"{where}: {k}: expected scales > 0")
    measured = checked_measured(d.get("measured", {}), measured_text, f"{where}: measured",
                                "the benchmark's or fit_forecaster's numbers")
    return Forecaster(VERSION, **t, measured=measured)


def measured_text(measured: dict[str, Any]) -> str:
    """One sentence quoting what a forecaster was measured to do on runs it was not fit on: the
    benchmark's held-out accuracy, how often its most confident forecasts were right and the
    benchmark configurations where it did worse than the linear baseline; or, for one fit on
    a user's own runs (``fit_forecaster``), its leave-one-run-out accuracy."""
    if not measured:
        return "no benchmark measurement recorded for this forecaster"
    if "held_out_runs_accuracy" in measured:  # fit_forecaster: fit on a user's own runs
        return (f"fit on {measured['n_runs']} of your runs; each forecast from its first "
                f"{measured['fraction']:.0%} of checkpoints by a fit on the others: "
                f"{measured['held_out_runs_accuracy']:.1%} of {measured['n_heads']} heads "
                f"(linear baseline {measured['baseline_accuracy']:.1%})"
                + _top_bin(measured.get("calibration_held_out_runs")))
    fresh = (f", {measured['fresh_accuracy']:.1%} on {measured['fresh_runs']} fresh runs "
             f"(baseline {measured['fresh_baseline_accuracy']:.1%})"
             if measured.get("fresh_runs") else "")
    notes = _top_bin(measured.get("calibration_held_out_seeds"))
    below = measured.get("below_baseline")
    if below is not None and measured.get("configs"):
        notes += (f"; below the baseline on {len(below)} of {len(measured['configs'])} "
                  f"benchmark configurations" + (f": {', '.join(below)}" if below else ""))
    return (f"benchmark accuracy from the first {measured.get('fraction', 0.2):.0%} of "
            f"checkpoints on held-out runs: {measured['held_out_seeds_accuracy']:.1%} (held-out "
            f"seeds), {measured['held_out_configs_accuracy']:.1%} (held-out configurations); "
            f"linear baseline {measured['baseline_accuracy']:.1%}; {measured['n_runs']} runs, "
            f"{measured['n_heads']} heads{fresh}{notes} "
            f"({measured.get('doc', 'docs/benchmarks.md')})")


def _top_bin(bins: list[dict[str, Any]] | None) -> str:
    """The clause "; forecasts stated at 90% or more were right ..." (a calibration's last
    bin; empty without one or when it holds no forecast)."""
    if not bins or not bins[-1]["heads"]:
        return ""
    top = bins[-1]
    return (f"; forecasts stated at {top['from']:.0%} or more were right "
            f"{top['accuracy']:.1%} of the time ({top['heads']} held-out heads)")


CONFIDENCE_BINS = (0.0, 0.5, 0.7, 0.9, 1.0)


def calibration(forecasts: Sequence[tuple[float, bool]]) -> list[dict[str, float]]:
    """How often forecasts were right by the probability they stated: per bin of
    ``CONFIDENCE_BINS`` (half-open, the last one closed) the number of forecasts in it and the
    share right. ``forecasts``: (stated probability, whether the forecast was right)."""
    out = []
    for lo, hi in zip(CONFIDENCE_BINS[:-1], CONFIDENCE_BINS[1:], strict=True):
        sel = [right for p, right in forecasts
               if lo <= p and (p < hi or hi == CONFIDENCE_BINS[-1])]
        out.append({"from": lo, "to": hi, "heads": len(sel),
                    "accuracy": round(sum(sel) / max(1, len(sel)), 4)})
    return out


def fit_forecaster(runs: Sequence[Trajectory], fraction: float = 0.2,
                   l2: float = 1e-3) -> Forecaster:
    """A forecaster fit on finished runs of one's own (e.g. other seeds of a spec), measured on
    them one run at a time.

    Fit like the packaged one: every head's features at every prefix of >= 2 checkpoints, its
    final role as the label, each run read as finished (its last checkpoint is its end). Its
    ``measured`` block holds what it can honestly claim: each run forecast from its first
    ``fraction`` of checkpoints by a forecaster fit on the *other* runs, against the final
    roles (``held_out_runs_accuracy``; by stated probability, ``calibration_held_out_runs``: a
    fit on a few runs states probabilities near 1 that it does not earn), with the linear
    baseline on the same heads. The benchmark's within-configuration rows measure what this
    buys on runs of one spec (docs/benchmarks.md).

    Raises:
        ValueError: fewer than 2 runs, the same run twice, a run whose first ``fraction`` of
            checkpoints is all of them, or a negative or non-finite ``l2``.
    """
    if len(runs) < 2:
        raise ValueError(f"runs: got {len(runs)}, expected at least 2 (each is measured by a "
                         "forecaster fit on the others)")
    if not (math.isfinite(l2) and l2 >= 0):
        raise ValueError(f"l2: got {l2}, expected a finite number >= 0")
    seen: dict[str, int] = {}
    for i, traj in enumerate(runs):
        n = n_early(len(traj.steps), fraction)
        if n >= len(traj.steps):
            raise ValueError(f"runs[{i}]: {len(traj.steps)} checkpoint(s), so its first "
                             f"{fraction:.0%} is all of them; expected more checkpoints")
        key = json.dumps(traj.to_dict(), sort_keys=True)
        if key in seen:  # a run measured by a fit on itself would grade its own training data
            raise ValueError(f"runs[{i}]: the same trajectory as runs[{seen[key]}], expected "
                             "distinct runs")
        seen[key] = i

    def fit(trajs: Sequence[Trajectory]) -> Forecaster:
        feats, labels = [], []
        for traj in trajs:
            final = [traj.final_role(h) for h in traj.heads]
            for n in range(2, len(traj.steps) + 1):
                feats.append(early_features(traj, n))
                labels += final
        return Forecaster.fit(EarlyFeatures.cat(feats), labels, VERSION, l2=l2)

    held_out: list[tuple[float, bool]] = []  # (stated probability, right) per head
    base = 0
    for i, traj in enumerate(runs):
        n = n_early(len(traj.steps), fraction)
        final = [traj.final_role(h) for h in traj.heads]
        others = fit([t for j, t in enumerate(runs) if j != i])
        held_out += [(c, p == t) for (p, c), t in zip(others.predict(traj, n), final,
                                                      strict=True)]
        base += sum(p == t for p, t in zip(linear_forecast(traj, n), final, strict=True))
    out = fit(runs)
    heads = len(held_out)
    out.measured = {"fraction": fraction, "n_runs": len(runs), "n_heads": heads,
                    "held_out_runs_accuracy": round(sum(r for _, r in held_out) / heads, 4),
                    "baseline_accuracy": round(base / heads, 4),
                    "calibration_held_out_runs": calibration(held_out)}
    return out


@dataclass(frozen=True)
class HeadForecast:
    """One head's forecast: predicted final role, its probability, and the observed commitment.

    ``committed_at`` is the first observed step from which the head's top role has been the
    predicted role (``None`` when its latest top role differs).
    """

    head: Head
    role: str
    confidence: float
    committed_at: int | None

    def to_dict(self) -> dict[str, Any]:
        return {"head": str(self.head), "role": self.role, "confidence": self.confidence,
                "committed_at": self.committed_at}


def forecast_heads(traj: Trajectory, forecaster: Forecaster, n: int | None = None,
                   total_steps: int | None = None) -> list[HeadForecast]:
    """The forecaster's prediction for every head from the first ``n`` checkpoints (default:
    all of them, e.g. during training), with the commitment observed so far."""
    n = len(traj.steps) if n is None else max(1, min(n, len(traj.steps)))
    seen = traj.upto(n)
    out = []
    for head, (role, conf) in zip(seen.heads, forecaster.predict(seen, n, total_steps),
                                  strict=True):
        committed = (seen.commitment_step(head) if seen.final_role(head) == role else None)
        out.append(HeadForecast(head, role, conf, committed))
    return out
