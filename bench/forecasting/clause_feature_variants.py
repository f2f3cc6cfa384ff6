"""Would more features improve clause-verdict forecasts? The packaged features against the
same with one or two added, on held-out seeds and held-out specs.

The errors clause forecasts still make are systematic per spec: a task floor flat at 0.65
through 20% of the budget that stays there, one flat at 0.3 that later rises. Two sources of
features that might tell them apart:

- the run's held-out task loss at the evaluation points in the first ``fraction`` of the
  budget (each record of ``clause_trajectories.py`` keeps the run's held-out loss; the
  clause's own task's loss with ``--task-loss`` where the clause names a task): ``slope``, the
  least-squares slope of log loss per budget (latest half of the points from eight on, as the
  clause line), ``tanh(slope / 5)``; ``drop``, ``tanh(log(first / latest) / 3)``, how much of
  the loss is gone; ``level``, ``tanh(log(latest))``; ``task_slope``, ``slope`` on task
  floors only (0 on other clauses);
- the shape of the clause's own early values: ``range``, ``tanh(3 (max - min) / scale)``,
  whether it has moved at all; ``accel``, the slope of the latest half of the points less
  the earliest half's, in ``scale`` units (``tanh``); ``noise``, the root-mean-square
  residual about one line through them, ``tanh(10 rms / scale)``.

Each variant is scored as ``bench_clause_forecast.py`` scores its splits (accuracy,
Brier score, ECE). The variants swap ``headwise.forecast.clauses.features``/``FEATURES`` in
this process only.

    OMP_NUM_THREADS=1 .venv/bin/python -m bench.forecasting.clause_feature_variants \
        --seeds 0 1 2 3 4 [--fit-configs DIR] [--config-seeds 0 ... 9] [--task-loss]
        [--variants packaged slope ...]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

import headwise.forecast.clauses as clauses
from bench.lab.clause_scoring import DEFAULT_DATA, Item, held_out, score, trajectories
from headwise.forecast.clauses import ClauseTrajectory

PACKAGED_FEATURES, PACKAGED = clauses.FEATURES, clauses.features
LOSS = "_loss"  # the context key the loss curve rides in (this script's only)


def _line(points: list[tuple[int, float]], total: int) -> tuple[float, float]:
    """(slope per budget, root-mean-square residual) of a least-squares line (0, 0: < 2)."""
    if len(points) < 2:
        return 0.0, 0.0
    x = torch.tensor([s / total for s, _ in points], dtype=torch.float64)
    y = torch.tensor([v for _, v in points], dtype=torch.float64)
    xm, ym = x.mean(), y.mean()
    slope = ((x - xm) * (y - ym)).sum() / ((x - xm) ** 2).sum().clamp_min(1e-12)
    return float(slope), float(((y - ym - slope * (x - xm)) ** 2).mean().sqrt())


def extra_features(t: ClauseTrajectory, fraction: float) -> dict[str, float]:
    """Every variant's added feature of ``t`` from the first ``fraction``."""
    curve = t.context[LOSS]
    pts = [p for p in curve if p[0] <= fraction * t.total_steps] or curve[:1]
    logs = [(s, math.log(max(v, 1e-6))) for s, v in pts]
    slope = math.tanh(_line(logs[len(logs) // 2:] if len(logs) >= 8 else logs,
                            t.total_steps)[0] / 5.0)
    task_floor = float(t.at_least is not None and t.context.get("kind") == "task")
    own = [(s, v) for s, v, _ in t.early(fraction)]
    values = [v for _, v in own]
    half = len(own) // 2
    accel = (_line(own[half:], t.total_steps)[0]
             - _line(own[:half + 1], t.total_steps)[0]) / t.scale
    return {"slope": slope, "drop": math.tanh((logs[0][1] - logs[-1][1]) / 3.0),
            "level": math.tanh(logs[-1][1]), "task_slope": slope * task_floor,
            "range": math.tanh(3.0 * (max(values) - min(values)) / t.scale),
            "accel": math.tanh(accel),
            "noise": math.tanh(10.0 * _line(own, t.total_steps)[1] / t.scale)}


VARIANTS = {"packaged": (), "slope": ("slope",), "drop": ("drop",), "level": ("level",),
            "slope+drop": ("slope", "drop"), "task_slope": ("task_slope",),
            "range": ("range",), "accel": ("accel",), "noise": ("noise",),
            "accel+range": ("accel", "range")}


def use(names: tuple[str, ...]) -> None:
    """Make ``headwise.forecast.clauses`` fit and forecast with ``names`` added."""
    clauses.FEATURES = (*PACKAGED_FEATURES, *(f"added_{n}" for n in names))  # names unique

    def features(t: ClauseTrajectory, fraction: float) -> list[float]:
        extra = extra_features(t, fraction)
        return [*PACKAGED(t, fraction), *(extra[n] for n in names)]

    clauses.features = features


def items(runs: list[dict[str, Any]], task_loss: bool) -> list[Item]:
    """The runs' clause trajectories, each carrying its run's loss curve."""
    out = []
    for run in runs:
        evals = run["losses"]["eval"]
        by_index = {c["index"]: c for c in run["clauses"]}
        for label, t in trajectories(run):
            task = by_index[int(label.rsplit("[", 1)[1][:-1])].get("task")
            own = task_loss and task and all(task in e[2] for e in evals)
            curve = [(e[0], e[2][task] if own else e[1]) for e in evals]
            out.append((run, label, dataclasses.replace(t, context={**t.context, LOSS: curve})))
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--data", type=Path, default=DEFAULT_DATA)
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4])
    p.add_argument("--fit-configs", type=Path, default=None)
    p.add_argument("--config-seeds", type=int, nargs="+", default=list(range(10)))
    p.add_argument("--task-loss", action="store_true")
    p.add_argument("--variants", nargs="+", choices=list(VARIANTS), default=list(VARIANTS))
    args = p.parse_args()
    runs = [r for f in sorted(args.data.glob("seed*/*.json"))
            if (r := json.loads(f.read_text()))["seed"] in args.seeds]
    if args.fit_configs:
        runs += [r for f in sorted(args.fit_configs.glob("seed*/*.json"))
                 if (r := json.loads(f.read_text()))["seed"] in args.config_seeds]
    data = items(runs, args.task_loss)
    print(f"{len(runs)} runs, {len(data)} clause trajectories\n")
    print("| features | split | fraction | right | Brier | ECE |\n|---|---|---:|---:|---:|---:|")
    splits: tuple[tuple[str, Callable[[dict[str, Any]], Any]], ...] = (
        ("held-out seeds", lambda r: r["seed"]), ("held-out specs", lambda r: r["spec"]))
    for name in args.variants:
        use(VARIANTS[name])
        for fraction in (0.1, 0.2, 0.4):
            for split, group in splits:
                s = score(held_out(data, fraction, group))
                print(f"| {name} | {split} | {fraction:.0%} | {s['accuracy']:.3f} | "
                      f"{s['brier']:.4f} | {s['ece']:.3f} |", flush=True)


if __name__ == "__main__":
    main()
