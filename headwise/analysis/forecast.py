"""Forecasts of heads' final roles from early checkpoints: the linear baseline and a fitted model.

Both read the first checkpoints of a ``Trajectory`` (scored by the role-table function) and
predict each head's final top role among ``CLASSES`` (the table's top-role candidates and
``"none"``, with the table's shown threshold ``SHOWN_MIN_SCORE``):

- ``linear_forecast`` (baseline): a least-squares line per role score through the early
  checkpoints, extrapolated to the last step and clipped to [0, 1]; the top role of those
  values, ``"none"`` below the threshold.
- ``Forecaster``: multinomial logistic regression on early signals (``early_features``: each
  role's latest score, its change, its slope projected to the end, its linear extrapolation,
  the current top role and the share of training seen). Its weights are small versioned JSON in
  the package (``headwise/data/forecaster_v1.json``, written by ``bench/bench_forecast.py``)
  together with the accuracy the benchmark measured on held-out runs; loading never unpickles.
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
from headwise.heads import Head

CLASSES = (*TOP_ROLE_CANDIDATES, "none")
FORECASTER_FILE = "forecaster_v1.json"
FORMAT = "headwise-forecaster"


def n_early(n_checkpoints: int, fraction: float) -> int:
    """Checkpoints in the first ``fraction`` of a trajectory: ``ceil(fraction * C)``, >= 2."""
    if not 0.0 < fraction <= 1.0:
        raise ValueError(f"fraction: got {fraction}, expected a number in (0, 1]")
    return min(n_checkpoints, max(2, math.ceil(fraction * n_checkpoints)))


def _candidate_values(traj: Trajectory) -> Tensor:
    """(C, N, 6) scores of the candidate roles; NaN where undefined or not scored."""
    C, N = len(traj.steps), len(traj.heads)
    out = torch.full((C, N, len(TOP_ROLE_CANDIDATES)), math.nan, dtype=torch.float64)
    for j, role in enumerate(TOP_ROLE_CANDIDATES):
        if role in traj.roles:
            out[:, :, j] = traj.values[:, :, traj.roles.index(role)]
    return out


def _fit_lines(x: Tensor, y: Tensor) -> tuple[Tensor, Tensor]:
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
    a, b = _fit_lines(x, _candidate_values(traj)[:n])
    return _top((a + b * end).clamp(0.0, 1.0), min_score)


FEATURES = (*(f"{k}:{r}" for k in ("last", "change", "gain", "linear")
              for r in TOP_ROLE_CANDIDATES),
            *(f"top:{c}" for c in CLASSES), "top_score", "margin", "seen")


def early_features(traj: Trajectory, n: int, total_steps: int | None = None,
                   min_score: float = SHOWN_MIN_SCORE) -> Tensor:
    """(N, F) early signals of every head from the first ``n`` checkpoints (``FEATURES``).

    Steps are read as fractions of ``total_steps`` (default: the last step), so runs of
    different lengths share one scale. Per candidate role: ``last`` score, ``change`` since the
    first checkpoint, ``gain`` (slope x remaining fraction, clipped to [-1, 1]), ``linear``
    (the baseline's clipped extrapolation); then the current top role (one-hot), its score,
    its margin over the runner-up and the share of training ``seen``. Undefined scores read 0.
    """
    n = max(1, min(n, len(traj.steps)))
    total = float(total_steps if total_steps is not None else traj.steps[-1])
    x = torch.tensor(traj.steps[:n], dtype=torch.float64) / total  # (n,)
    y = _candidate_values(traj)[:n]  # (n, N, R)
    a, b = _fit_lines(x, y)
    last = y[-1]
    seen = float(x[-1])
    z = torch.nan_to_num
    change = z(last - y[0])
    gain = z(b * (1.0 - seen)).clamp(-1.0, 1.0)
    linear = z((a + b).clamp(0.0, 1.0))
    tops = _top(last, min_score)
    onehot = torch.tensor([[float(t == c) for c in CLASSES] for t in tops], dtype=torch.float64)
    filled = z(last, nan=0.0)
    two = filled.topk(2, dim=1).values
    extra = torch.stack([two[:, 0], two[:, 0] - two[:, 1],
                         torch.full_like(two[:, 0], seen)], dim=1)
    return torch.cat([z(last), change, gain, linear, onehot, extra], dim=1)


@dataclass
class Forecaster:
    """Multinomial logistic regression from ``early_features`` to ``CLASSES``.

    ``p(class | f) = softmax(W ((f - mean) / std) + b)``. ``measured`` holds what the benchmark
    measured on held-out runs (accuracy, fraction, command), quoted by reports.
    """

    version: str
    mean: Tensor  # (F,)
    std: Tensor  # (F,)
    weight: Tensor  # (K, F)
    bias: Tensor  # (K,)
    measured: dict[str, Any] = field(default_factory=dict)

    def probabilities(self, feats: Tensor) -> Tensor:
        """(N, K) class probabilities for (N, F) features."""
        zf = (feats - self.mean) / self.std
        return torch.softmax(zf @ self.weight.T + self.bias, dim=-1)

    def predict(self, traj: Trajectory, n: int, total_steps: int | None = None
                ) -> list[tuple[str, float]]:
        """Per head: (predicted final role, its probability) from the first ``n`` checkpoints."""
        p = self.probabilities(early_features(traj, n, total_steps))
        conf, idx = p.max(dim=1)
        return [(CLASSES[int(i)], float(c)) for i, c in zip(idx, conf, strict=True)]

    @classmethod
    def fit(cls, feats: Tensor, labels: Sequence[str], version: str, l2: float = 1e-2,
            measured: dict[str, Any] | None = None) -> Forecaster:
        """Fit on (M, F) features and M class names (L2-penalised, L-BFGS, float64)."""
        y = torch.tensor([CLASSES.index(c) for c in labels])
        mean = feats.mean(0)
        std = feats.std(0).clamp_min(1e-6)
        zf = (feats - mean) / std
        w = torch.zeros(len(CLASSES), feats.shape[1], dtype=torch.float64, requires_grad=True)
        b = torch.zeros(len(CLASSES), dtype=torch.float64, requires_grad=True)
        opt = torch.optim.LBFGS([w, b], max_iter=500, line_search_fn="strong_wolfe")

        def closure() -> Tensor:
            opt.zero_grad()
            loss = (torch.nn.functional.cross_entropy(zf @ w.T + b, y)
                    + l2 * (w ** 2).sum())
            loss.backward()
            return loss

        opt.step(closure)
        return cls(version, mean, std, w.detach(), b.detach(), dict(measured or {}))

    def to_json(self) -> str:
        """The forecaster as JSON (``load_forecaster`` reads it back)."""
        return json.dumps({
            "format": FORMAT, "version": self.version, "classes": list(CLASSES),
            "features": list(FEATURES), "mean": self.mean.tolist(), "std": self.std.tolist(),
            "weight": self.weight.tolist(), "bias": self.bias.tolist(),
            "measured": self.measured}, indent=1)


def load_forecaster(path: str | Path | None = None) -> Forecaster:
    """Read a forecaster from JSON (default: the one packaged with headwise). Plain JSON only.

    Raises:
        ValueError: not a forecaster file, or one made for other classes or features.
    """
    if path is None:
        text = resources.files("headwise.data").joinpath(FORECASTER_FILE).read_text("utf-8")
        where = f"headwise/data/{FORECASTER_FILE}"
    else:
        text, where = Path(path).read_text("utf-8"), str(path)
    d = json.loads(text)
    if not isinstance(d, dict) or d.get("format") != FORMAT:
        raise ValueError(f"{where}: format: expected {FORMAT!r}")
    if d.get("classes") != list(CLASSES) or d.get("features") != list(FEATURES):
        raise ValueError(f"{where}: classes/features: expected {list(CLASSES)} and "
                         f"{len(FEATURES)} features {list(FEATURES)[:3]}...")

    def t(key: str) -> Tensor:
        return torch.tensor(d[key], dtype=torch.float64)

    f = Forecaster(str(d["version"]), t("mean"), t("std"), t("weight"), t("bias"),
                   dict(d.get("measured") or {}))
    if f.weight.shape != (len(CLASSES), len(FEATURES)) or f.bias.shape != (len(CLASSES),):
        raise ValueError(f"{where}: weight/bias: expected shapes "
                         f"({len(CLASSES)}, {len(FEATURES)}) and ({len(CLASSES)},)")
    return f


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
