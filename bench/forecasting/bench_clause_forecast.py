"""Clause-verdict forecasts scored on runs they were not fit on: forecaster vs extrapolation.

Reads the trajectories ``clause_trajectories.py`` wrote (every clause of the public
contract suite at every evaluation point, plain and under ``--enforce``, per seed) and, from
the points in the first 10%, 20% and 40% of each run's budget, forecasts whether each clause
holds at the end (on the verification set) with ``headwise.forecast.clauses`` (and from
60% and 80%, the models ``headwise train --forecast-every`` uses late in a run):

- held-out seeds: fit on the runs of the other seeds (every spec), forecast this seed's;
- held-out specs (configurations): fit on the other specs (every seed), forecast this one's.

Per fraction and split it prints the share of verdicts right (forecaster; extrapolation
baseline), Brier scores (the baseline's 0/1 verdicts), the forecaster's expected calibration
error (10 bins), the coverage of its 90% value interval, the share of forecasts it flagged as
outside its fitted range, and a paired exact sign test over the clauses exactly one of the two
gets right. At 20% it prints the held-out-spec verdicts per spec, and the calibration bins.
Clauses never measured (no value at any evaluation point) are not forecast.

The splits use the runs of ``--seeds``; ``--confirm`` then fits one forecaster per fraction on
all of them and scores it on the runs of fresh seeds (never read while the forecaster was
designed), per fraction and, at 20%, per spec, and ``--save`` writes those forecasters with
the fresh seeds' figures as the packaged ``headwise/data/clause_forecaster_v3.json``.

``--configs DIR`` scores the forecasters fit on every run of ``--seeds`` on the runs
``clause_trajectories.py --configs`` wrote: the forecast benchmark's configurations
with their contracts (``bench.lab.config_contracts``), per fraction, plain and enforced, and
per configuration at 20%; with ``--save`` their figures join the packaged file's ``measured``
block; with ``--confirm`` too, it also prints both sets of fresh runs pooled.
``--fit-configs DIR ...`` adds every configuration run in those directories (at any seed) to
the runs fit on and split, beside the suite's: ``--configs`` then scores fresh seeds of
configurations the fit has seen other seeds of.

``--score FILE`` scores a forecaster file already written (the packaged one, an earlier
one) on the ``--confirm`` and ``--configs`` runs instead of fitting one; with ``--save`` it
rewrites that file's ``measured`` block with those figures (its models unchanged), refusing
runs of seeds the forecaster was fit on.

    .venv/bin/python -m bench.forecasting.bench_clause_forecast [--data DIR]
        [--seeds 0 1 2] [--confirm 3 4] [--save] [--configs DIR] [--fit-configs DIR ...]
        [--score FILE]
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from bench.lab.clause_scoring import (
    DEFAULT_DATA,
    Item,
    calibration_groups,
    forecast_rows,
    held_out,
    score,
    trajectories,
)
from bench.lab.scoring import calibration_bins
from bench.lab.workers import ROOT
from headwise.forecast.clauses import (
    PACKAGED,
    ClauseForecaster,
    ClauseForecasters,
    load_clause_forecasters,
)

FRACTIONS = (0.1, 0.2, 0.4, 0.6, 0.8)  # the three, and two later ones for `train`
PACKAGE_FILE = ROOT / "headwise" / "data" / PACKAGED
COMMAND = ("OMP_NUM_THREADS=1 .venv/bin/python -m bench.forecasting.clause_trajectories "
           "--seeds 0 1 ... 16 --jobs 2; the same with --configs --seeds 0 1 ... 24 --out "
           "bench/.cache/clause_traj_configs and --configs --seeds 25 ... 34 --out "
           "bench/.cache/clause_traj_configs_fresh4; .venv/bin/python "
           "-m bench.forecasting.bench_clause_forecast --seeds 0 1 ... 12 --fit-configs "
           "bench/.cache/clause_traj_configs --confirm 13 14 15 16 --configs "
           "bench/.cache/clause_traj_configs_fresh4 --save")
SCORE_COMMAND = ("OMP_NUM_THREADS=1 .venv/bin/python -m bench.forecasting.clause_trajectories "
                 "--seeds 13 14 15 16 18 19 ... 25 --jobs 2; the same with --configs --seeds "
                 "25 26 ... 54 --out bench/.cache/clause_traj_configs_fresh; .venv/bin/python "
                 "-m bench.forecasting.bench_clause_forecast --score "
                 "headwise/data/clause_forecaster_v3.json --confirm 13 14 15 16 18 19 ... 25 "
                 "--configs bench/.cache/clause_traj_configs_fresh --save")


def rounded(figures: dict[str, Any]) -> dict[str, Any]:
    """``score``'s figures as the packaged file's ``measured`` block keeps them."""
    return {k: round(v, 4) if isinstance(v, float) else v for k, v in figures.items()}


def bins_of(rows: Sequence[dict[str, Any]]) -> list[tuple[float, float, float, int]]:
    """``calibration_bins`` of forecast rows."""
    return calibration_bins([r["p"] for r in rows], [r["holds"] for r in rows])


def figure(curves: dict[str, list[tuple[float, float, float, int]]], path: Path) -> None:
    """The calibration curves (share held against mean stated probability) as a PNG."""
    import matplotlib.pyplot as plt

    from headwise.render.figures import fig_png

    fig, ax = plt.subplots(figsize=(4.2, 3.6))
    ax.plot([0, 1], [0, 1], color="grey", linestyle=":", label="perfectly calibrated")
    for name, bins in curves.items():
        ax.plot([b[1] for b in bins], [b[2] for b in bins], marker="o", markersize=3,
                label=name)
    ax.set_xlabel("stated probability of holding (bin mean)", fontsize=8)
    ax.set_ylabel("share of clauses that held", fontsize=8)
    ax.set_title("clause-verdict forecasts from 20% of the budget", fontsize=9)
    ax.legend(fontsize=7, loc="upper left")
    path.write_bytes(fig_png(fig))


def line(name: str, s: dict[str, Any]) -> str:
    return (f"| {name} | {s['n']} | {s['accuracy']:.3f} | {s['baseline_accuracy']:.3f} | "
            f"{s['brier']:.3f} | {s['baseline_brier']:.3f} | {s['ece']:.3f} | "
            f"{s['coverage']:.3f} | {s['outside']:.2f} | {s['wins']} / {s['losses']} "
            f"(p = {s['p_sign']:.3g}) |")


def header(first: str) -> str:
    """The markdown header of a table of ``line`` rows, its first column named ``first``."""
    return (f"| {first} | clauses | right: forecaster | right: baseline | Brier | Brier "
            "baseline | ECE | 90% interval coverage | outside range | forecaster-only right / "
            "baseline-only right (sign test) |\n|---|---:|---:|---:|---:|---:|---:|---:|---:|---|")


def fraction_table(models: Sequence[ClauseForecaster], items: Sequence[Item], group: Any,
                   name: str, curve: str,
                   curves: dict[str, list[tuple[float, float, float, int]]],
                   figures: dict[str, Any]
                   ) -> tuple[dict[str, Any], dict[float, list[dict[str, Any]]]]:
    """Print each model's figures on ``items`` (all runs, plain, enforced), record them in
    ``figures`` (``"<name> <fraction>"``) and the 20% calibration in ``curves[curve]``.
    Returns the per-fraction figures, rounded, for the packaged file's ``measured`` block,
    and the forecast rows per fraction."""
    print(header("fraction, runs"))
    measured: dict[str, Any] = {}
    rows_at: dict[float, list[dict[str, Any]]] = {}
    for model in models:
        rows = rows_at[model.fraction] = forecast_rows(model, items, group)
        s = score(rows)
        measured[str(model.fraction)] = rounded(s)
        figures[f"{name} {model.fraction}"] = s
        print(line(f"{model.fraction:.0%}, all", s))
        for mode in ("plain", "enforced"):
            print(line(f"{model.fraction:.0%}, {mode}",
                       score([r for r in rows if r["mode"] == mode])))
        if model.fraction == 0.2:
            curves[curve] = bins_of(rows)
    return measured, rows_at


def group_table(rows: Sequence[dict[str, Any]], first: str) -> None:
    """Print the figures of ``rows`` per group (spec or configuration), ``first`` naming it."""
    print(f"| {first} | clauses | right: forecaster | right: baseline | outside range | "
          "forecaster-only / baseline-only (sign test) |")
    print("|---|---:|---:|---:|---:|---|")
    for g in sorted({r["group"] for r in rows}):
        s = score([r for r in rows if r["group"] == g])
        print(f"| {g} | {s['n']} | {s['accuracy']:.3f} | {s['baseline_accuracy']:.3f} | "
              f"{s['outside']:.2f} | {s['wins']} / {s['losses']} (p = {s['p_sign']:.3g}) |")


def configs_table(bundle: ClauseForecasters, data: Path,
                  curves: dict[str, list[tuple[float, float, float, int]]],
                  figures: dict[str, Any]
                  ) -> tuple[dict[str, Any], list[int], dict[float, list[dict[str, Any]]]]:
    """Print ``bundle``'s figures on the configuration runs in ``data`` (``fraction_table``,
    then per configuration at 20%). Returns the per-fraction figures for the packaged file's
    ``measured`` block, the runs' seeds and the forecast rows per fraction."""
    runs = [json.loads(f.read_text()) for f in sorted(data.glob("seed*/*.json"))]
    if not runs:
        raise SystemExit(f"--configs {data}: no runs (python -m "
                         "bench.forecasting.clause_trajectories --configs)")
    seeds = sorted({r["seed"] for r in runs})
    items = [(run, label, t) for run in runs for label, t in trajectories(run)]
    print(f"\nForecast-benchmark configurations ({len(runs)} runs: "
          f"{len({r['spec'] for r in runs})} configurations, seeds {seeds}; {len(items)} clause "
          f"trajectories), forecasters fit on every run of seeds {bundle.measured['fit_seeds']} "
          f"(configuration runs of seeds {bundle.measured['fit_configs_seeds']}):\n")
    measured, rows_at = fraction_table(bundle.models, items, lambda r: r["spec"], "configs",
                                       "forecast-benchmark configurations", curves, figures)
    print("\nPer configuration at 20%:\n")
    group_table(rows_at[0.2], "configuration")
    return measured, seeds, rows_at


def rescored(bundle: ClauseForecasters, fresh_seeds: Sequence[int]) -> None:
    """Make ``bundle``'s ``measured`` block (its fresh and configuration figures already
    replaced by this run's) say which runs it now quotes; refuse runs it was fit on."""
    m = bundle.measured
    if set(fresh_seeds) & set(m["fit_seeds"]) or (
            set(m["configs_seeds"]) & set(m["fit_configs_seeds"])):
        raise SystemExit("--score --save: the scored runs include seeds the forecaster was fit "
                         "on; its figures must come from runs it never saw")
    m["fresh_seeds"] = sorted(fresh_seeds)
    m["scored_by"] = SCORE_COMMAND


def splits(items: Sequence[Item], figures: dict[str, Any]
           ) -> dict[str, list[tuple[float, float, float, int]]]:
    """Print the held-out-seed and held-out-spec figures of ``items`` per fraction and mode,
    the held-out specs at 20% per spec and their calibration bins (``figures`` records each);
    returns that calibration curve."""
    print(header("split, fraction"))
    per_spec: list[dict[str, Any]] = []
    for fraction in FRACTIONS:
        for split, group in (("held-out seeds", lambda r: r["seed"]),
                             ("held-out specs", lambda r: r["spec"])):
            if len({group(run) for run, _, _ in items}) < 2:
                continue
            rows = held_out(items, fraction, group)
            s = score(rows)
            figures[f"{split} {fraction}"] = s
            print(line(f"{split}, {fraction:.0%}", s))
            for mode in ("plain", "enforced"):
                sub = [r for r in rows if r["mode"] == mode]
                figures[f"{split} {fraction} {mode}"] = score(sub)
                print(line(f"{split}, {fraction:.0%}, {mode} runs", score(sub)))
            if fraction == 0.2 and split == "held-out specs":
                per_spec = rows
    print("\nHeld-out specs at 20%, per spec:\n")
    group_table(per_spec, "spec")
    print("\nCalibration, held-out specs at 20% (stated probability of holding):\n")
    print("| bin | clauses | mean stated | share held |")
    print("|---|---:|---:|---:|")
    curves = {"held-out specs": bins_of(per_spec)}
    for lo, mean_p, held, n in curves["held-out specs"]:
        print(f"| {lo:.1f}-{lo + 0.1:.1f} | {n} | {mean_p:.3f} | {held:.3f} |")
    return curves


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--data", type=Path, default=DEFAULT_DATA)
    p.add_argument("--json", type=Path, default=None, help="also write every figure here")
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--confirm", type=int, nargs="*", default=[])
    p.add_argument("--save", action="store_true")
    p.add_argument("--figure", type=Path, default=None,
                   help="with --confirm: write the calibration curve at 20%% (PNG) here")
    p.add_argument("--configs", type=Path, default=None,
                   help="also score on these forecast-benchmark configuration runs")
    p.add_argument("--fit-configs", type=Path, nargs="+", default=[],
                   help="forecast-benchmark configuration runs (every seed) to fit on too")
    p.add_argument("--score", type=Path, default=None,
                   help="score this clause-forecaster file on --confirm/--configs runs "
                        "instead of fitting one (no held-out splits)")
    args = p.parse_args()
    if args.save and not args.confirm:
        raise SystemExit("--save: needs --confirm SEED ... (the figures the file quotes)")
    if args.save and args.score and not args.configs:
        raise SystemExit("--score --save: needs --configs DIR too (every figure the file "
                         "quotes is replaced, none left from other runs)")
    every = [json.loads(f.read_text()) for f in sorted(args.data.glob("seed*/*.json"))]
    figures: dict[str, Any] = {}
    curves: dict[str, list[tuple[float, float, float, int]]] = {}
    if args.score:
        bundle = load_clause_forecasters(args.score)
        seeds = bundle.measured.get("fit_seeds")
        if not (isinstance(seeds, list)
                and isinstance(bundle.measured.get("fit_configs_seeds"), list)):
            raise SystemExit(f"--score {args.score}: measured.fit_seeds/fit_configs_seeds: "
                             "expected lists of the seeds it was fit on (to tell the runs it "
                             "never saw)")
        print(f"Scoring {args.score} (fit on suite seeds {seeds}, configuration seeds "
              f"{bundle.measured['fit_configs_seeds']})")
    else:
        fit_configs = [json.loads(f.read_text()) for d in args.fit_configs
                       for f in sorted(d.glob("seed*/*.json"))]
        runs = [run for run in every if run["seed"] in args.seeds] + fit_configs
        items = [(run, label, t) for run in runs for label, t in trajectories(run)]
        seeds = sorted({run["seed"] for run in runs if run.get("suite", "suite") == "suite"})
        print(f"{len(runs)} runs ({len({r['spec'] for r in runs})} specs, seeds {seeds}), "
              f"{len(items)} clause trajectories\n")
        curves = splits(items, figures)
        bundle = ClauseForecasters(tuple(
            ClauseForecaster.fit([t for _, _, t in items], fraction,
                                 calibration_groups(run for run, _, _ in items))
            for fraction in FRACTIONS), {
            "fit_seeds": seeds, "fresh_seeds": list(args.confirm),
            "fit_configs_seeds": sorted({r["seed"] for r in fit_configs}),
            "specs": sorted({run["spec"] for run in runs}), "command": COMMAND,
            "doc": "docs/benchmarks.md#clause-verdict-forecasts"})
    models = bundle.models
    if args.confirm:
        fresh = [(run, label, t) for run in every if run["seed"] in args.confirm
                 for label, t in trajectories(run)]
        if not fresh:
            raise SystemExit(f"--confirm {args.confirm}: no runs of those seeds in {args.data}")
        print(f"\nFresh seeds {args.confirm} ({len(fresh)} clause trajectories), forecasters "
              f"fit on every run of seeds {seeds}:\n")
        measured, fresh_rows = fraction_table(models, fresh, lambda r: r["spec"], "fresh",
                                              f"fresh seeds {args.confirm}", curves, figures)
        bundle.measured["fresh"] = measured
        print(f"\nFresh seeds {args.confirm} at 20%, per spec:\n")
        group_table(fresh_rows[0.2], "spec")
    if args.configs:
        bundle.measured["configs"], bundle.measured["configs_seeds"], config_rows = (
            configs_table(bundle, args.configs, curves, figures))
    if args.confirm and args.configs:
        print("\nFresh suite seeds and configuration runs pooled:\n")
        print(header("fraction"))
        bundle.measured["pooled"] = {}
        for fraction in FRACTIONS:
            s = figures[f"pooled {fraction}"] = score(fresh_rows[fraction] + config_rows[fraction])
            bundle.measured["pooled"][str(fraction)] = rounded(s)
            print(line(f"{fraction:.0%}", s))
    if args.save:
        target = args.score or PACKAGE_FILE
        if args.score:
            rescored(bundle, args.confirm)
        tmp = target.with_suffix(".tmp")
        tmp.write_text(bundle.to_json() + "\n")
        tmp.replace(target)
        print(f"\nwrote {target}")
    if args.figure:
        figure(curves, args.figure)
    if args.json:
        args.json.write_text(json.dumps(figures, indent=1))


if __name__ == "__main__":
    main()
