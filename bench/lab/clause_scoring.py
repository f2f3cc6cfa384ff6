"""Clause-verdict forecasts scored on recorded runs: what the clause forecast benchmarks share.

A run's record (``bench.forecasting.clause_trajectories`` writes one per run, in
``bench/.cache/clause_traj/`` by default) becomes one ``ClauseTrajectory`` per measured clause
(``trajectories``); ``held_out`` forecasts each group's clauses with a forecaster fit on every
other group's; ``forecast_rows`` sets each forecast beside the extrapolation baseline's verdict
(``extrapolation_holds``) and the outcome, and ``score`` gives a split's figures: accuracy,
Brier score, expected calibration error, interval coverage, and a paired sign test.
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

from bench.lab.config_contracts import spec_text
from bench.lab.scoring import brier, expected_calibration_error, sign_test
from bench.lab.suite import SUITE
from bench.lab.workers import BENCH
from headwise.forecast.clauses import BASE, ClauseForecaster, ClauseTrajectory, features

DEFAULT_DATA = BENCH / ".cache" / "clause_traj"  # clause_trajectories' records
Item = tuple[dict[str, Any], str, ClauseTrajectory]  # (run record, clause label, trajectory)


def extrapolation_holds(traj: ClauseTrajectory, fraction: float) -> bool:
    """The baseline's verdict from the first ``fraction`` of the budget: the least-squares line
    through the early points (their latest half from eight on), extrapolated to the last step
    and clipped to the value's range, meets the clause's bound. That line's margin is the
    forecaster's ``margin_line`` feature (squashed by ``tanh``, which keeps its sign)."""
    return features(traj, fraction)[BASE.index("margin_line")] >= 0


def run_spec(run: dict[str, Any]) -> Any:
    """The spec ``run`` trained, as parsed (a suite spec or, for records of
    ``clause_trajectories --configs``, a forecast-benchmark configuration's)."""
    from headwise.runspec import load_spec

    if run.get("suite", "suite") == "suite":
        return load_spec(SUITE / f"{run['spec']}.yaml")
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / f"{run['spec']}.yaml"
        path.write_text(spec_text(run["spec"], run["seed"]))
        return load_spec(path)


def trajectories(run: dict[str, Any]) -> list[tuple[str, ClauseTrajectory]]:
    """(spec/clause label, trajectory) for every measured clause of one run's record (each
    value's range from the clause kind, on the spec's contract as parsed; the run's context
    as ``train --forecast-every`` gives it, ``Spec.forecast_context``)."""
    spec = run_spec(run)
    out = []
    for c in run["clauses"]:
        if all(v is None for v in c["values"]) or c["final"] is None:
            continue
        clause = spec.contract[c["index"]]
        low, high = clause.entry.value_range(clause)
        context = {**spec.forecast_context, "kind": c["kind"]}
        out.append((f"{run['spec']}[{c['index']}]", ClauseTrajectory(
            tuple(c["steps"]), tuple(c["values"]), tuple(c["stderrs"]), c["at_least"],
            c["at_most"], run["total_steps"], run["mode"] == "enforced", low, high, c["final"],
            c["holds"], context)))
    return out


def score(rows: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """The figures of one split's forecasts (see the module docstring)."""
    p = [r["p"] for r in rows]
    y = [r["holds"] for r in rows]
    right = [(r["p"] >= 0.5) == r["holds"] for r in rows]
    base = [r["base"] == r["holds"] for r in rows]
    wins = sum(a and not b for a, b in zip(right, base, strict=True))
    losses = sum(b and not a for a, b in zip(right, base, strict=True))
    return {"n": len(rows), "accuracy": sum(right) / len(rows),
            "baseline_accuracy": sum(base) / len(rows), "brier": brier(p, y),
            "baseline_brier": brier([float(r["base"]) for r in rows], y),
            "ece": expected_calibration_error(p, y),
            "coverage": sum(r["lo"] <= r["final"] <= r["hi"] for r in rows) / len(rows),
            "outside": sum(r["outside"] for r in rows) / len(rows),
            "wins": wins, "losses": losses, "p_sign": sign_test(wins, losses)}


def forecast_rows(model: ClauseForecaster, items: Sequence[Item], group: Any
                  ) -> list[dict[str, Any]]:
    """``model``'s forecast and the baseline's for each clause of ``items``."""
    rows = []
    for run, label, t in items:
        f = model.forecast(t)
        base = extrapolation_holds(t, model.fraction)
        rows.append({"group": group(run) if callable(group) else group, "label": label,
                     "mode": run["mode"], "p": f.probability, "holds": bool(t.holds),
                     "base": base, "final": t.final, "lo": f.interval[0], "hi": f.interval[1],
                     "outside": bool(f.outside)})
    return rows


def calibration_groups(runs: Iterable[dict[str, Any]]) -> list[int]:
    """The calibration groups of ``ClauseForecaster.fit``: each run's training seed (one
    seed's runs of a spec are alike; on the design data grouping by spec instead calibrated
    no better on held-out specs, and worse on held-out seeds)."""
    return [run["seed"] for run in runs]


def held_out(items: Sequence[Item], fraction: float,
             group: Callable[[dict[str, Any]], Any]) -> list[dict[str, Any]]:
    """Forecast each group's clauses with a forecaster fit on every other group's."""
    rows = []
    for g in sorted({group(run) for run, _, _ in items}):
        rest = [(run, t) for run, _, t in items if group(run) != g]
        model = ClauseForecaster.fit([t for _, t in rest], fraction,
                                     calibration_groups(run for run, _ in rest))
        rows += forecast_rows(model, [i for i in items if group(i[0]) == g], g)
    return rows
