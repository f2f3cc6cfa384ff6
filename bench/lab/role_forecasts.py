"""Role forecasts of the forecast benchmark's runs, as rows a table can score.

A *predictor* maps (run, fraction of its checkpoints) to each head's forecast role and its
stated probability: ``baseline`` (the linear extrapolation, no probability) or ``fitted`` (a
``Forecaster`` fit on other runs). ``score`` gives every head's forecast at every fraction as
``bench.lab.forecast_tables.Row`` records. ``fitted`` also takes the candidate features an
ablation scores beside the packaged ones (``EXTRA_ROLE``, ``EXTRA_NONE``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

from bench.lab.forecast_tables import FRACTIONS, NEAR, Row, Rows
from headwise.analysis.role_table import SHOWN_MIN_SCORE
from headwise.forecast.roles import NONE_FEATURES, ROLE_FEATURES, candidate_values, fit_lines

# (run, fraction) -> per head: (forecast, its probability or None)
Predictor = Callable[[dict, float], list[tuple[str, float | None]]]


def truth(r: dict) -> list[str]:
    """The final role of every head of run ``r``."""
    return [r["traj"].final_role(h) for h in r["traj"].heads]


def train_rows(rs: list[dict], extended: bool = False) -> tuple[Any, list[str]]:
    """Features at every prefix of >= 2 checkpoints (forecasts during training may come at any
    point of a run), with the final roles (``extended``: with ``EXTRA_ROLE``/``EXTRA_NONE``)."""
    from headwise.forecast.roles import EarlyFeatures

    feats, labels = [], []
    for r in rs:
        for n in range(2, len(r["traj"].steps) + 1):
            feats.append(features_of(r, n, extended))
            labels += truth(r)
    return EarlyFeatures.cat(feats), labels


# Candidate features scored with --ablation besides forecast.ROLE_FEATURES / NONE_FEATURES.
# Training signals: commitment (share of early checkpoints with the role / ``none`` as top
# role), the gradient alignment in pattern space (``align_*``) and parameter space
# (``reach_*``): latest, mean over the early checkpoints, lead over the best other role, whether
# it is the best; the loss curve (loss now / first loss, the latest relative drop carried to the
# end). Curve shape: the score at the first checkpoint and the latest and
# extrapolated scores as multiples of it (``start``, ``rise``, ``linear_rise``), each role's mean
# projected gain and mean score over the run's heads (``run_gain``, ``run_last``), and the change
# of slope between the two halves of the early checkpoints carried to the end (``accel``).
SIGNAL_ROLE = ["persist", "align_last", "align_mean", "lead_align", "align_best", "reach_last",
               "reach_mean", "lead_reach", "reach_best"]
SHAPE_ROLE = ["start", "rise", "linear_rise", "run_gain", "run_last", "accel"]
EXTRA_ROLE = SIGNAL_ROLE + SHAPE_ROLE
EXTRA_NONE = ["persist_none", "align_top", "reach_top", "loss_ratio", "loss_recent"]


def _extra(traj: Any, n: int, x: Tensor) -> tuple[list[Tensor], list[Tensor]]:
    """The ``EXTRA_ROLE`` (each (N, R)) and ``EXTRA_NONE`` (each (N,)) features."""
    from headwise.forecast.roles import lead, onehot

    y = candidate_values(traj)[:n]
    tops = list(zip(*(traj.top_roles(h, SHOWN_MIN_SCORE)[:n] for h in traj.heads),
                    strict=True))  # per checkpoint: every head's top role
    roles = [torch.stack([onehot(t) for t in tops]).mean(0)]
    none = [torch.tensor([[float(r == "none") for r in t] for t in tops],
                         dtype=torch.float64).mean(0)]
    for series in (traj.alignment, traj.param_alignment):
        al = torch.nan_to_num(series[:n])  # (n, N, R)
        mean = al.mean(0)
        roles += [al[-1], mean, lead(mean),
                  (mean >= mean.max(1, keepdim=True).values).to(torch.float64)]
        none.append(mean.max(1).values)
    loss, first = traj.loss[:n], max(float(traj.loss[0]), 1e-12)
    drop = ((float(loss[-2]) - float(loss[-1])) / first / float(x[-1] - x[-2])
            * (1 - float(x[-1])) if n >= 2 else 0.0)
    N = y.shape[1]
    none += [torch.full((N,), min(2.0, float(loss[-1]) / first), dtype=torch.float64),
             torch.full((N,), max(-1.0, min(1.0, drop)), dtype=torch.float64)]
    return roles + _shape(y, x), none


def _shape(y: Tensor, x: Tensor) -> list[Tensor]:
    """The ``SHAPE_ROLE`` features (each (N, R)) of early scores ``y`` (n, N, R) at ``x``."""

    z = torch.nan_to_num(y)
    seen, n = float(x[-1]), len(x)
    a, b = fit_lines(x, y)
    linear = torch.nan_to_num((a + b).clamp(0.0, 1.0))
    gain = torch.nan_to_num(b * (1.0 - seen)).clamp(-1.0, 1.0)
    start = z[0].clamp_min(0.02)
    accel = torch.zeros_like(gain)
    if n >= 3:
        half = n // 2
        _, b1 = fit_lines(x[:half + 1], y[:half + 1])
        _, b2 = fit_lines(x[half:], y[half:])
        accel = torch.nan_to_num((b2 - b1) * (1.0 - seen)).clamp(-1.0, 1.0)
    return [z[0], (z[-1] / start).clamp(0.0, 10.0), (linear / start).clamp(0.0, 10.0),
            gain.mean(0, keepdim=True).expand_as(gain),
            z[-1].mean(0, keepdim=True).expand_as(gain), accel]


def features_of(r: dict, n: int, extended: bool = False) -> Any:
    """``early_features`` of run ``r`` from ``n`` checkpoints, with the extra ones appended
    (``extended``; cached on the run)."""
    from headwise.forecast.roles import EarlyFeatures, early_features

    cache = r.setdefault("_features", {})
    if (n, extended) not in cache:
        f = early_features(r["traj"], n, r["total_steps"])
        if extended:
            x = torch.tensor(r["traj"].steps[:n], dtype=torch.float64) / r["total_steps"]
            roles, none = _extra(r["traj"], n, x)
            f = EarlyFeatures(torch.cat([f.roles, torch.stack(roles, -1)], -1),
                              torch.cat([f.none, torch.stack(none, -1)], -1))
        cache[n, extended] = f
    return cache[n, extended]


# The packaged forecaster's features (score features only).
SCORES = (list(ROLE_FEATURES), list(NONE_FEATURES))


def fitted(rs: list[dict], version: str,
           features: tuple[list[str], list[str]] | None = None) -> Predictor:
    """A predictor fit on runs ``rs`` (``features``: names from the score and extra features;
    default: the packaged forecaster's)."""
    from headwise.forecast.roles import CLASSES, EarlyFeatures, Forecaster, n_early

    names = (SCORES[0] + EXTRA_ROLE, SCORES[1] + EXTRA_NONE)

    def cut(f: EarlyFeatures) -> EarlyFeatures:
        if features is None:
            return f
        ri = [names[0].index(x) for x in features[0]]
        ni = [names[1].index(x) for x in features[1]]
        return EarlyFeatures(f.roles[..., ri], f.none[:, ni])

    feats, labels = train_rows(rs, features is not None)
    model = Forecaster.fit(cut(feats), labels, version=version)

    def predict(r: dict, frac: float) -> list[tuple[str, float | None]]:
        n = n_early(len(r["traj"].steps), frac)
        p = model.probabilities(cut(features_of(r, n, features is not None)))
        conf, idx = p.max(dim=1)
        return [(CLASSES[int(i)], float(c)) for i, c in zip(idx, conf, strict=True)]

    predict.model = model  # type: ignore[attr-defined]
    return predict


def baseline(r: dict, frac: float) -> list[tuple[str, float | None]]:
    """The linear-extrapolation baseline's forecast for run ``r`` (it states no probability)."""
    from headwise.forecast.roles import linear_forecast, n_early

    return [(role, None) for role in
            linear_forecast(r["traj"], n_early(len(r["traj"].steps), frac), r["total_steps"])]


def near_threshold(r: dict) -> list[bool]:
    """Per head of run ``r``: whether its final top score is within ``NEAR`` of the threshold."""
    top = torch.nan_to_num(candidate_values(r["traj"])[-1], nan=0.0).max(1).values  # (N,)
    return [abs(float(v) - SHOWN_MIN_SCORE) < NEAR for v in top]


def score(predictor: Predictor, rs: list[dict]) -> dict[float, Rows]:
    """The predictor's forecasts for every head of runs ``rs`` at every fraction."""
    return {frac: [Row(r["config"], r["seed"], str(h), t, p, near, conf) for r in rs
                   for h, t, (p, conf), near in zip(r["traj"].heads, truth(r),
                                                    predictor(r, frac), near_threshold(r),
                                                    strict=True)]
            for frac in FRACTIONS}
