"""Forecast benchmark: predict heads' final roles from early checkpoints, on runs not fit on.

Trains CONFIGS x SEEDS small runs (one torch thread) with checkpoints, scores every checkpoint
with the role-table function (``run_role_table``, the table ``headwise analyze`` shows), and
caches each run's trajectory in ``bench/.cache/forecast/<code key>/`` (gitignored; a finished
run is not retrained while the code that shapes it is unchanged, so an interrupted benchmark
resumes, and a change to role scores or training reruns everything). Then it scores, from the
first 10%, 20% and 40% of checkpoints, the linear-extrapolation baseline and the fitted
forecaster:

- held-out seeds: fit on the runs of the other seeds (all configurations), predict this seed;
- held-out configurations: fit on the other configurations (all seeds), predict this one.

It prints markdown tables (accuracy per configuration and overall, and the confusion tables
at 20%). Then it fits the forecaster on every run of ``--seeds`` and scores it, with the
baseline, on runs of fresh seeds (``--confirm``). With ``--save`` it writes that forecaster to
``headwise/data/forecaster_v2.json`` with the measured accuracies.

``--suite`` adds the public contract suite's specs (``headwise/examples/suite/``, contracts
removed, specs that train identically counted once: 9 configurations) as further
configurations: fitted on and predicted like the four above (held-out seeds and held-out
configurations over all 13), reported per configuration and together.

``--ablation`` adds rows for forecasters fit with candidate features besides the score ones
(``ABLATION``: commitment, gradient alignment in pattern and in parameter space, the loss
curve, and the shape of the early score curves), scored the same way. The training signals
they need are computed from each run's checkpoints by
``bench.lab.forecast_signals.gradient_signals`` on the held-out mixture and cached
next to the trajectories (keyed by that module's code).

``--within`` adds forecasters fit within each configuration (on its other seeds only): an
estimate of what the signals can tell once a configuration's behaviour is known.

Per configuration at 20% it prints each forecaster against the baseline head by head (heads
only one of them gets right, with an exact sign test), and the calibration of the stated
probabilities.

    OMP_NUM_THREADS=1 .venv/bin/python -m bench.forecasting.bench_forecast [--save] [--ablation]
        [--suite] [--within]
        [--seeds 0 1 2] [--confirm 5 6 7]   (default: seeds 0-19, fresh seeds 20-24)
"""

from __future__ import annotations

import argparse
import time
from typing import Any

import torch

from bench.lab.forecast_tables import (
    FRACTIONS,
    Preds,
    Rows,
    acc,
    below_baseline,
    calibration,
    print_accuracy,
    print_calibration,
    print_confusion,
    print_near,
    print_paired,
    print_suite,
)
from bench.lab.role_forecasts import (
    EXTRA_NONE,
    SCORES,
    SHAPE_ROLE,
    SIGNAL_ROLE,
    baseline,
    fitted,
    score,
    truth,
)
from bench.lab.role_runs import BASE, CACHE, CONFIGS, code_key, load_runs, suite_configs
from bench.lab.workers import ROOT

OUT = ROOT / "headwise" / "data" / "forecaster_v2.json"
COMMAND = ("OMP_NUM_THREADS=1 .venv/bin/python -m bench.forecasting.bench_forecast --save "
           "--ablation")

# Feature sets scored side by side with --ablation (the packaged forecaster: ``SCORES``).
ABLATION = {
    "scores + commitment": (SCORES[0] + SIGNAL_ROLE[:1], SCORES[1] + EXTRA_NONE[:1]),
    "scores + pattern alignment": (SCORES[0] + SIGNAL_ROLE[1:5], SCORES[1] + EXTRA_NONE[1:2]),
    "scores + parameter alignment": (SCORES[0] + SIGNAL_ROLE[5:], SCORES[1] + EXTRA_NONE[2:3]),
    "scores + loss curve": (SCORES[0], SCORES[1] + EXTRA_NONE[3:]),
    "all training signals": (SCORES[0] + SIGNAL_ROLE, SCORES[1] + EXTRA_NONE),
    "scores + start level": (SCORES[0] + SHAPE_ROLE[:3], SCORES[1]),
    "scores + run level": (SCORES[0] + SHAPE_ROLE[3:5], SCORES[1]),
    "scores + acceleration": (SCORES[0] + SHAPE_ROLE[5:], SCORES[1]),
    "scores + curve shape": (SCORES[0] + SHAPE_ROLE, SCORES[1]),
}


def cross_validate(runs: list[dict], seeds: list[int], ablation: bool,
                   within: bool = False) -> dict[str, dict]:
    """Baseline and fitted forecasters on held-out seeds and held-out configurations; with
    ``within``, also fit within each configuration (``within_configuration``)."""
    variants = {"": None, **({f" ({k})": v for k, v in ABLATION.items()} if ablation else {})}
    preds: Preds = {"baseline": score(baseline, runs)}
    for label, features in variants.items():
        for scheme, groups in (("held-out seeds", [("seed", s) for s in seeds]),
                               ("held-out configs", [("config", c) for c in CONFIGS])):
            if scheme == "held-out seeds" and len(seeds) < 2:
                continue
            rows: dict[float, Rows] = {f: [] for f in FRACTIONS}
            for field, value in groups:
                fit_on = [r for r in runs if r[field] != value]
                test = [r for r in runs if r[field] == value]
                got = score(fitted(fit_on, "cv", features), test)
                for f in FRACTIONS:
                    rows[f] += got[f]
            preds[scheme + label] = rows
    if within and len(seeds) >= 2:
        for label in ("", " (all training signals)"):
            preds["within configuration" + label] = within_configuration(
                runs, seeds, ABLATION["all training signals"] if label else None)
    return preds


def within_configuration(runs: list[dict], seeds: list[int],
                         features: tuple[list[str], list[str]] | None) -> dict[float, Rows]:
    """Each run forecast by a forecaster fit only on the other seeds of *its own*
    configuration: what these signals can tell about a configuration whose behaviour the
    forecaster has seen (an estimate of the attainable, not a forecaster a user gets)."""
    rows: dict[float, Rows] = {f: [] for f in FRACTIONS}
    for config in CONFIGS:
        for seed in seeds:
            fit_on = [r for r in runs if r["config"] == config and r["seed"] != seed]
            test = [r for r in runs if r["config"] == config and r["seed"] == seed]
            got = score(fitted(fit_on, "cv", features), test)
            for f in FRACTIONS:
                rows[f] += got[f]
    return rows


def save(model: Any, preds: dict, confirm: dict, runs: list[dict], confirm_runs: list[dict],
         seeds: list[int], fresh: list[int], within: bool) -> None:
    """Write the packaged forecaster with what the benchmark measured (20% of checkpoints)."""
    from headwise.atomic import write_bytes_atomic

    model.measured = {
        "fraction": 0.2, "n_runs": len(runs), "configs": list(CONFIGS), "seeds": seeds,
        "held_out_seeds_accuracy": round(acc(preds["held-out seeds"][0.2])[0], 4),
        "held_out_configs_accuracy": round(acc(preds["held-out configs"][0.2])[0], 4),
        "baseline_accuracy": round(acc(preds["baseline"][0.2])[0], 4),
        "n_heads": acc(preds["baseline"][0.2])[1],
        "command": COMMAND + (" --suite" if len(CONFIGS) > len(BASE) else "")
        + (" --within" if within else ""),
        "fresh_seeds": fresh, "fresh_runs": len(confirm_runs),
        "fresh_accuracy": round(acc(confirm[f"forecaster v{model.version}"][0.2])[0], 4),
        "fresh_baseline_accuracy": round(acc(confirm["baseline"][0.2])[0], 4),
        "calibration_held_out_seeds": calibration(preds["held-out seeds"][0.2]),
        "below_baseline": below_baseline(preds, list(CONFIGS)),
        "doc": "docs/benchmarks.md#forecasting-final-roles"}
    write_bytes_atomic(OUT, model.to_json().encode())
    print(f"written: {OUT.relative_to(ROOT)} ({model.measured})")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--seeds", type=int, nargs="+", default=list(range(20)))
    p.add_argument("--confirm", type=int, nargs="*", default=[20, 21, 22, 23, 24],
                   help="fresh seeds: the forecaster fit on every --seeds run predicts them "
                        "(the packaged one's test)")
    p.add_argument("--save", action="store_true", help=f"write {OUT.relative_to(ROOT)}")
    p.add_argument("--suite", action="store_true",
                   help="add the contract suite's specs as configurations (suite_configs)")
    p.add_argument("--within", action="store_true",
                   help="also fit within each configuration (within_configuration)")
    p.add_argument("--ablation", action="store_true",
                   help="also score forecasters fit on subsets of the features (ABLATION)")
    args = p.parse_args()
    if set(args.confirm) & set(args.seeds):
        p.error(f"--confirm: seeds {sorted(set(args.confirm) & set(args.seeds))} are also in "
                "--seeds; the fresh-seed check must use runs the forecaster was not fit on")
    torch.set_num_threads(1)
    from headwise.forecast.roles import VERSION

    if args.suite:
        CONFIGS.update(suite_configs())
    key = code_key()
    print(f"code key {key}; cache {CACHE.relative_to(ROOT)}/{key}", flush=True)
    t0 = time.perf_counter()
    runs = load_runs(args.seeds, key)
    preds = cross_validate(runs, args.seeds, args.ablation, args.within)
    print(f"\n{len(runs)} runs ({len(CONFIGS)} configurations x seeds {args.seeds}), training "
          f"+ scoring {sum(r['seconds'] for r in runs) / 60:.1f} min, training signals "
          f"{sum(r['signal_seconds'] for r in runs if 'signal_seconds' in r):.0f} s, total "
          f"{time.perf_counter() - t0:.0f} s (this invocation)\n")
    print_accuracy(preds, list(CONFIGS), BASE)
    print_suite({k: v for k, v in preds.items() if "(" not in k}, list(CONFIGS), BASE)
    for scheme in ("held-out configs", "held-out seeds", "baseline"):
        if scheme in preds:
            print_confusion(preds[scheme][0.2], scheme)
    print_near(preds)
    main_schemes: list[str] = [
        s for s in ("held-out seeds", "held-out configs", "within configuration",
                    "within configuration (all training signals)") if s in preds]
    print_paired(preds, main_schemes, list(CONFIGS))
    print_calibration(preds, main_schemes[:2])
    final = fitted(runs, VERSION)
    confirm_runs = load_runs(args.confirm, key)
    confirm = {"baseline": score(baseline, confirm_runs),
               f"forecaster v{VERSION}": score(final, confirm_runs)}
    if confirm_runs:
        print(f"\nConfirmation on fresh seeds {args.confirm} ({len(confirm_runs)} runs), "
              f"forecaster fit on every run of seeds {args.seeds}\n")
        print_accuracy(confirm, list(CONFIGS), BASE)
        print_suite(confirm, list(CONFIGS), BASE)
        print_paired(confirm, [f"forecaster v{VERSION}"], list(CONFIGS))
        print_calibration(confirm, [f"forecaster v{VERSION}"])
    dist = {c: sum(1 for r in runs for t in truth(r) if t == c) for c in
            sorted({t for r in runs for t in truth(r)})}
    print(f"\nfinal roles over all heads: {dist}")
    if args.save:
        save(final.model, preds, confirm, runs, confirm_runs,  # type: ignore[attr-defined]
             args.seeds, args.confirm, args.within)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
