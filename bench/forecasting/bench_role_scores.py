"""Role-score forecasts with intervals: how often a decided forecast is right, how many heads
are left undecided, and whether the intervals cover the final scores, on runs not fit on.

Runs (trained once and cached like ``bench_forecast.py``'s, by ``bench.lab.role_runs.run_one``):
the forecast benchmark's four configurations and the contract suite's specs without their
contracts (plain runs), and the suite's specs with their contracts under ``--enforce``
(``enforced-<spec>``). Every run has 20 checkpoints scored with the role-table function.

From the first 10%, 20% and 40% of checkpoints it scores ``RoleScoreForecaster``
(``headwise.forecast.role_scores``):

- held-out seeds: fit on the other seeds' runs (every configuration), forecast this seed;
- held-out configurations: fit on the other configurations (every seed), forecast this one
  (a plain and an enforced run of one suite spec are held out together);
- fresh seeds (``--confirm``): fit on every run of ``--seeds``, read once.

Per split, mode (plain / enforced) and configuration: the share of heads decided, the
accuracy of decided forecasts, the accuracy of every head's forecast role, the share of final
scores inside their intervals, and beside them the role forecaster v2 (probabilities, no
intervals) and the linear baseline on the same heads, and v2 on as many heads as are decided,
those it states the highest probability for (does the interval pick safer heads than v2's
own confidence?); for held-out configurations, decided
accuracy inside and outside the fitted range. ``--save`` writes the forecaster fit on every
``--seeds`` run to ``headwise/data/role_score_forecaster_v1.json`` with the fresh seeds'
figures.

    OMP_NUM_THREADS=1 .venv/bin/python -m bench.forecasting.bench_role_scores \
        [--seeds 0 1 2] [--confirm 3 4] [--train-only] [--save]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import time
from typing import Any

import torch

from bench.lab.role_forecasts import baseline, fitted, truth
from bench.lab.role_runs import CACHE, CONFIGS, code_key, enforced_configs, run_one, suite_configs
from bench.lab.workers import ROOT
from headwise.forecast.roles import candidate_values

OUT = ROOT / "headwise" / "data" / "role_score_forecaster_v1.json"
COMMAND = "OMP_NUM_THREADS=1 .venv/bin/python -m bench.forecasting.bench_role_scores --save"
FRACTIONS = (0.1, 0.2, 0.4)


def configs() -> dict[str, str]:
    """Every configuration (the benchmark's four, the suite's specs plain and enforced) and
    the cache key of each: the forecast benchmark's code key for the plain ones (shared with
    ``bench_forecast.py --suite``), that key with the enforced specs' text for the others."""
    CONFIGS.update(suite_configs())
    key = code_key()
    enforced = enforced_configs()
    CONFIGS.update(enforced)
    ekey = hashlib.sha256((key + json.dumps(enforced, sort_keys=True)).encode()).hexdigest()
    return {name: ekey[:12] if name in enforced else key for name in CONFIGS}


def group(name: str) -> str:
    """The configuration a run is held out with: a suite spec's plain and enforced runs
    together (their models are the same)."""
    stem = name.removeprefix("enforced-").removeprefix("suite-")
    return stem if name.startswith(("enforced-", "suite-")) else name


def load(seeds: list[int], keys: dict[str, str]) -> list[dict[str, Any]]:
    """Every configuration's run for ``seeds`` (trained and cached on first use)."""
    from headwise.analysis import Trajectory
    from headwise.forecast.role_scores import RoleRun
    from headwise.runspec import load_spec

    out = []
    for seed in seeds:
        for name in CONFIGS:
            rec = run_one(name, seed, keys[name])
            spec = load_spec(CACHE / "runs" / f"{name}_s{seed}.yaml")  # run_one's copy
            traj = Trajectory.from_dict(rec["trajectory"])
            run = RoleRun(traj, rec["total_steps"], name.startswith("enforced-"),
                          spec.forecast_context)
            # "traj" and "total_steps" as bench.lab.role_forecasts' predictors read a run
            out.append({"config": name, "group": group(name), "seed": seed, "run": run,
                        "traj": traj, "total_steps": rec["total_steps"],
                        "seconds": rec["seconds"]})
    return out


def finals(r: dict[str, Any]) -> list[dict[str, float]]:
    """Per head: each defined role's final score."""
    from headwise.analysis import TOP_ROLE_CANDIDATES

    last = candidate_values(r["run"].traj)[-1]
    return [{role: float(last[i, j]) for j, role in enumerate(TOP_ROLE_CANDIDATES)
             if not torch.isnan(last[i, j])} for i in range(last.shape[0])]


def evaluate(fit_on: list[dict[str, Any]], test: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per head of ``test`` and fraction: the score forecast, v2's and the baseline's."""
    from headwise.forecast.role_scores import RoleScoreForecaster
    from headwise.forecast.roles import n_early

    model = RoleScoreForecaster.fit([r["run"] for r in fit_on])
    v2 = fitted(fit_on, "cv")  # the role forecaster, fit on the same runs
    rows = []
    for r in test:
        run, true, fin = r["run"], truth(r), finals(r)
        for frac in FRACTIONS:
            got = model.forecast(run, n_early(len(run.traj.steps), frac))
            cls, base = v2(r, frac), baseline(r, frac)
            for f, t, final, (c, conf), (b, _) in zip(got, true, fin, cls, base, strict=True):
                inside = [f.scores[k][1] <= v <= f.scores[k][2]
                          for k, v in final.items() if k in f.scores]
                rows.append({"config": r["config"], "seed": r["seed"], "fraction": frac,
                             "enforced": run.enforced, "decided": f.decided,
                             "right": f.role == t, "v2_right": c == t, "base_right": b == t,
                             "v2_confidence": conf,
                             "covered": sum(inside), "scores": len(inside),
                             "outside": bool(f.outside)})
    return rows


def summary(rows: list[dict[str, Any]]) -> dict[str, float]:
    dec = [r for r in rows if r["decided"]]
    # as many heads as are decided, those v2 states the highest probability for
    confident = sorted(rows, key=lambda r: -r["v2_confidence"])[:len(dec)]
    n = max(1, len(rows))
    return {"heads": len(rows), "decided": len(dec) / n,
            "decided_accuracy": sum(r["right"] for r in dec) / max(1, len(dec)),
            "accuracy": sum(r["right"] for r in rows) / n,
            "v2_accuracy": sum(r["v2_right"] for r in rows) / n,
            "v2_on_decided": sum(r["v2_right"] for r in dec) / max(1, len(dec)),
            "v2_most_confident": sum(r["v2_right"] for r in confident) / max(1, len(dec)),
            "base_accuracy": sum(r["base_right"] for r in rows) / n,
            "base_on_decided": sum(r["base_right"] for r in dec) / max(1, len(dec)),
            "coverage": sum(r["covered"] for r in rows) / max(1, sum(r["scores"] for r in rows))}


HEADER = ("| {} | heads | decided | right when decided | v2 on those | v2's most confident, as "
          "many | baseline on those | every head: forecast role | v2 | baseline | interval "
          "coverage |\n|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")


def line(label: str, rows: list[dict[str, Any]]) -> str:
    s = summary(rows)
    return (f"| {label} | {s['heads']} | {s['decided']:.1%} | **{s['decided_accuracy']:.1%}** | "
            f"{s['v2_on_decided']:.1%} | {s['v2_most_confident']:.1%} | "
            f"{s['base_on_decided']:.1%} | {s['accuracy']:.1%} | "
            f"{s['v2_accuracy']:.1%} | {s['base_accuracy']:.1%} | {s['coverage']:.1%} |")


def report(title: str, rows: list[dict[str, Any]], per_config: bool) -> None:
    print(f"\n#### {title}\n")
    print(HEADER.format("from the first"))
    for frac in FRACTIONS:
        at = [r for r in rows if r["fraction"] == frac]
        print(line(f"{frac:.0%}", at))
        for mode, enforced in (("plain", False), ("enforced", True)):
            print(line(f"{frac:.0%}, {mode} runs", [r for r in at if r["enforced"] == enforced]))
        if any(r["outside"] for r in at):
            for label, out in (("inside the fitted range", False), ("outside it", True)):
                print(line(f"{frac:.0%}, {label}", [r for r in at if r["outside"] == out]))
    if per_config:
        print()
        print(HEADER.format("20%, per configuration"))
        at = [r for r in rows if r["fraction"] == 0.2]
        for config in dict.fromkeys(r["config"] for r in at):
            print(line(config, [r for r in at if r["config"] == config]))


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--confirm", type=int, nargs="*", default=[3, 4])
    p.add_argument("--train-only", action="store_true",
                   help="train and cache the runs of --seeds, score nothing")
    p.add_argument("--save", action="store_true", help=f"write {OUT.relative_to(ROOT)}")
    args = p.parse_args()
    if set(args.confirm) & set(args.seeds):
        p.error("--confirm: fresh seeds must not be in --seeds")
    torch.set_num_threads(1)
    keys = configs()
    print(f"cache {CACHE.relative_to(ROOT)}/{{{', '.join(sorted(set(keys.values())))}}}",
          flush=True)
    t0 = time.perf_counter()
    runs = load(args.seeds, keys)
    if args.train_only:
        print(f"{len(runs)} runs cached ({time.perf_counter() - t0:.0f} s)")
        return 0
    seeds_rows, config_rows = [], []
    for seed in args.seeds:
        seeds_rows += evaluate([r for r in runs if r["seed"] != seed],
                               [r for r in runs if r["seed"] == seed])
    for g in dict.fromkeys(r["group"] for r in runs):
        config_rows += evaluate([r for r in runs if r["group"] != g],
                                [r for r in runs if r["group"] == g])
    print(f"{len(runs)} runs ({len(CONFIGS)} configurations x seeds {args.seeds}); "
          f"training + scoring {sum(r['seconds'] for r in runs) / 60:.1f} min of one thread")
    report("Held-out seeds", seeds_rows, per_config=True)
    report("Held-out configurations", config_rows, per_config=True)
    fresh = load(args.confirm, keys)
    fresh_rows = evaluate(runs, fresh) if fresh else []
    if fresh:
        report(f"Fresh seeds {args.confirm}, fit on every run of seeds {args.seeds}",
               fresh_rows, per_config=False)
    if args.save:
        save(runs, args.seeds, args.confirm, seeds_rows, config_rows, fresh_rows)
    return 0


def save(runs: list[dict[str, Any]], seeds: list[int], fresh: list[int],
         seeds_rows: list[dict[str, Any]], config_rows: list[dict[str, Any]],
         fresh_rows: list[dict[str, Any]]) -> None:
    """Write the forecaster fit on every run of ``seeds`` with the measured figures at 20%."""
    from headwise.atomic import write_bytes_atomic
    from headwise.forecast.role_scores import RoleScoreForecaster

    def at20(rows: list[dict[str, Any]]) -> dict[str, float]:
        return {k: round(v, 4) for k, v in
                summary([r for r in rows if r["fraction"] == 0.2]).items()}

    model = RoleScoreForecaster.fit([r["run"] for r in runs])
    model.measured = {"fraction": 0.2, "n_runs": len(runs), "seeds": seeds,
                      "fresh_seeds": fresh, "held_out_seeds": at20(seeds_rows),
                      "held_out_configs": at20(config_rows), "fresh": at20(fresh_rows),
                      "command": COMMAND,
                      "doc": "docs/benchmarks.md#role-score-forecasts-with-intervals"}
    write_bytes_atomic(OUT, model.to_json().encode())
    print(f"written: {OUT.relative_to(ROOT)}")


if __name__ == "__main__":
    raise SystemExit(main())
