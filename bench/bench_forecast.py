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
baseline, on runs of fresh seeds (``--confirm``, never used while the features were designed).
With ``--save`` it writes that forecaster to ``headwise/data/forecaster_v1.json`` with the
measured accuracies.

    .venv/bin/python bench/bench_forecast.py [--save] [--seeds 0 1 2]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
CACHE = ROOT / "bench" / ".cache" / "forecast"
OUT = ROOT / "headwise" / "data" / "forecaster_v1.json"
FRACTIONS = (0.1, 0.2, 0.4)
CHECKPOINTS = 20  # checkpoints per run (checkpoint_every = steps / 20)
COMMAND = "OMP_NUM_THREADS=1 .venv/bin/python bench/bench_forecast.py --save"  # seeds 0-4, 5-7

# Four configurations of the issue: an induction circuit on random periods, a multi-task model
# with task gates, pattern objectives and masks on some heads, a bidirectional model.
CONFIGS: dict[str, str] = {
    "induction": """
model: {n_layers: 2, n_heads: 4, d_model: 64, vocab_size: 32, max_seq_len: 32, attn_only: true}
data:
  tasks:
    induction: {seq_len: 32, period: [4, 12]}
  eval_examples: 256
train: {steps: 1200, batch_size: 32, lr: 1.0e-3, warmup_steps: 20, checkpoint_every: 60,
        seed: SEED}
""",
    "gates": """
model: {n_layers: 2, n_heads: 4, d_model: 32, vocab_size: 20, max_seq_len: 15}
data:
  tasks:
    copy: {task: copy, length: 6}
    reverse: {task: reverse, length: 6}
  eval_examples: 256
train: {steps: 400, batch_size: 32, lr: 3.0e-3, warmup_steps: 20, checkpoint_every: 20,
        seed: SEED}
heads:
  L0.H2: {tasks: [copy]}
  L0.H3: {tasks: [reverse]}
  L1.H0: {tasks: [copy]}
  L1.H1: {tasks: [reverse]}
""",
    "levers": """
model: {n_layers: 2, n_heads: 4, d_model: 32, vocab_size: 20, max_seq_len: 18}
data:
  tasks:
    sort: {task: sort, length: 8}
  eval_examples: 256
train: {steps: 400, batch_size: 32, lr: 3.0e-3, warmup_steps: 20, checkpoint_every: 20,
        seed: SEED}
heads:
  L0.H0: {mask: previous_token}
  L0.H1: {objective: {target: first_token, kind: ce, weight: 1.0}}
  L1.H0: {objective: {target: self, kind: ce, weight: 0.5}}
""",
    "bidirectional": """
model: {n_layers: 2, n_heads: 4, d_model: 32, vocab_size: 20, max_seq_len: 17, causal: false}
data:
  tasks:
    bracket_depth: {n_pairs: 8, vocab_size: 20}
  eval_examples: 256
train: {steps: 400, batch_size: 32, lr: 3.0e-3, warmup_steps: 20, checkpoint_every: 20,
        seed: SEED}
""",
}


def code_key() -> str:
    """A hash of the package code that shapes a run's trajectory (training, model, data, role
    scores, probes) and of the configurations: cached runs are reused only while it holds."""
    h = hashlib.sha256()
    for path in sorted((ROOT / "headwise").rglob("*.py")):
        rel = path.relative_to(ROOT).as_posix()
        if rel.startswith("headwise/cli/") or "/forecast" in rel or "/report" in rel:
            continue
        h.update(rel.encode() + path.read_bytes())
    h.update(json.dumps(CONFIGS, sort_keys=True).encode())
    return h.hexdigest()[:12]


def run_one(name: str, seed: int, key: str) -> dict:
    """Train one run (or read its cached trajectory) and return the cached record."""
    from headwise.pipeline.report import run_trajectory
    from headwise.pipeline.run import train_run

    path = CACHE / key / f"{name}_s{seed}.json"
    if path.is_file():
        return json.loads(path.read_text())
    run_dir = CACHE / "runs" / f"{name}_s{seed}"
    run_dir.mkdir(parents=True, exist_ok=True)
    spec = run_dir.parent / f"{name}_s{seed}.yaml"
    spec.write_text(f"name: {name}\n" + CONFIGS[name].replace("SEED", str(seed)))
    t0 = time.perf_counter()
    outcome = train_run(spec, run_dir, overwrite=True, progress=False)
    traj = run_trajectory(run_dir, outcome.compiled)
    assert traj is not None
    record = {"config": name, "seed": seed, "total_steps": outcome.train.step,
              "seconds": time.perf_counter() - t0, "trajectory": traj.to_dict()}
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(record))
    print(f"  {name} seed {seed}: {record['seconds']:.0f} s, {len(traj.steps)} checkpoints, "
          f"final roles {[traj.final_role(h) for h in traj.heads]}", flush=True)
    return record


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4])
    p.add_argument("--confirm", type=int, nargs="*", default=[5, 6, 7],
                   help="fresh seeds, never used while designing the features: the forecaster "
                        "fit on every --seeds run predicts them (the packaged one's test)")
    p.add_argument("--save", action="store_true", help="write headwise/data/forecaster_v1.json")
    args = p.parse_args()
    torch.set_num_threads(1)
    sys.path.insert(0, str(ROOT))
    from headwise.analysis.forecast import (
        CLASSES,
        EarlyFeatures,
        Forecaster,
        early_features,
        linear_forecast,
        n_early,
    )
    from headwise.analysis.trajectories import Trajectory

    key = code_key()
    print(f"code key {key}; cache {CACHE.relative_to(ROOT)}/{key}", flush=True)
    t0 = time.perf_counter()
    runs = []
    for seed in args.seeds:  # seeds outermost: an interrupted benchmark has every config
        for name in CONFIGS:
            rec = run_one(name, seed, key)
            runs.append({**rec, "traj": Trajectory.from_dict(rec["trajectory"])})
    train_seconds = sum(r["seconds"] for r in runs)

    def truth(r: dict) -> list[str]:
        return [r["traj"].final_role(h) for h in r["traj"].heads]

    def train_rows(rs: list[dict]) -> tuple[EarlyFeatures, list[str]]:
        """Features at every prefix of >= 2 checkpoints (forecasts during training may come at
        any point of a run), with the final roles."""
        feats, labels = [], []
        for r in rs:
            for n in range(2, len(r["traj"].steps) + 1):
                feats.append(early_features(r["traj"], n, r["total_steps"]))
                labels += truth(r)
        return EarlyFeatures.cat(feats), labels

    def predict(f: Forecaster, r: dict, frac: float) -> list[str]:
        n = n_early(len(r["traj"].steps), frac)
        return [c for c, _ in f.predict(r["traj"], n, r["total_steps"])]

    def baseline(r: dict, frac: float) -> list[str]:
        return linear_forecast(r["traj"], n_early(len(r["traj"].steps), frac), r["total_steps"])

    # predictions[scheme][frac] = list of (config, truth, predicted) per head
    preds: dict[str, dict[float, list[tuple[str, str, str]]]] = {
        s: {f: [] for f in FRACTIONS} for s in ("baseline", "held-out seeds", "held-out configs")}
    for r in runs:
        for frac in FRACTIONS:
            preds["baseline"][frac] += [(r["config"], t, p)
                                        for t, p in zip(truth(r), baseline(r, frac), strict=True)]
    for seed in args.seeds if len(args.seeds) > 1 else ():
        fit_on = [r for r in runs if r["seed"] != seed]
        f = Forecaster.fit(*train_rows(fit_on), version="cv")
        for r in (r for r in runs if r["seed"] == seed):
            for frac in FRACTIONS:
                preds["held-out seeds"][frac] += [
                    (r["config"], t, p) for t, p in zip(truth(r), predict(f, r, frac),
                                                        strict=True)]
    for name in CONFIGS:
        fit_on = [r for r in runs if r["config"] != name]
        f = Forecaster.fit(*train_rows(fit_on), version="cv")
        for r in (r for r in runs if r["config"] == name):
            for frac in FRACTIONS:
                preds["held-out configs"][frac] += [
                    (r["config"], t, p) for t, p in zip(truth(r), predict(f, r, frac),
                                                        strict=True)]

    def acc(rows: list[tuple[str, str, str]], config: str | None = None) -> tuple[float, int]:
        sel = [(t, p) for c, t, p in rows if config is None or c == config]
        return sum(t == p for t, p in sel) / max(1, len(sel)), len(sel)

    print(f"\n{len(runs)} runs ({len(CONFIGS)} configurations x seeds {args.seeds}), "
          f"training + scoring {train_seconds / 60:.1f} min, total {time.perf_counter() - t0:.0f}"
          f" s (this invocation)\n")
    print("| checkpoints seen | forecaster | " + " | ".join(CONFIGS) + " | overall |")
    print("|---|---|" + "---|" * (len(CONFIGS) + 1))
    for frac in FRACTIONS:
        for scheme in preds:
            cells = []
            for name in CONFIGS:
                a, n = acc(preds[scheme][frac], name)
                if not n:
                    continue
                cells.append(f"{a:.1%} ({n})")
            a, n = acc(preds[scheme][frac])
            print(f"| first {frac:.0%} | {scheme} | " + " | ".join(cells) + f" | **{a:.1%}** "
                  f"({n}) |")
    for scheme in ("held-out configs", "baseline"):
        print(f"\nConfusion at 20% ({scheme}; rows: final role, columns: forecast)\n")
        print("| final \\ forecast | " + " | ".join(CLASSES) + " |")
        print("|---|" + "---|" * len(CLASSES))
        rows = preds[scheme][0.2]
        for t in CLASSES:
            counts = [sum(1 for _, tt, pp in rows if tt == t and pp == p) for p in CLASSES]
            if sum(counts):
                print(f"| {t} | " + " | ".join(str(c) for c in counts) + " |")
    final = Forecaster.fit(*train_rows(runs), version="1")
    confirm_runs = []
    for seed in args.confirm:
        for name in CONFIGS:
            rec = run_one(name, seed, key)
            confirm_runs.append({**rec, "traj": Trajectory.from_dict(rec["trajectory"])})
    confirm: dict[str, dict[float, list[tuple[str, str, str]]]] = {
        s: {f: [] for f in FRACTIONS} for s in ("baseline", "forecaster (fit on all)")}
    for r in confirm_runs:
        for frac in FRACTIONS:
            confirm["baseline"][frac] += [(r["config"], t, p) for t, p in
                                          zip(truth(r), baseline(r, frac), strict=True)]
            confirm["forecaster (fit on all)"][frac] += [
                (r["config"], t, p) for t, p in zip(truth(r), predict(final, r, frac),
                                                    strict=True)]
    if confirm_runs:
        print(f"\nConfirmation on fresh seeds {args.confirm} ({len(confirm_runs)} runs), "
              f"forecaster fit on every run of seeds {args.seeds}\n")
        print("| checkpoints seen | forecaster | " + " | ".join(CONFIGS) + " | overall |")
        print("|---|---|" + "---|" * (len(CONFIGS) + 1))
        for frac in FRACTIONS:
            for scheme in confirm:
                cells = []
                for name in CONFIGS:
                    a, n = acc(confirm[scheme][frac], name)
                    cells.append(f"{a:.1%} ({n})")
                a, n = acc(confirm[scheme][frac])
                print(f"| first {frac:.0%} | {scheme} | " + " | ".join(cells)
                      + f" | **{a:.1%}** ({n}) |")
    dist = {c: sum(1 for r in runs for t in truth(r) if t == c) for c in CLASSES}
    print(f"\nfinal roles over all heads: {dist}")
    if args.save:
        measured = {
            "fraction": 0.2, "n_runs": len(runs), "configs": list(CONFIGS), "seeds": args.seeds,
            "held_out_seeds_accuracy": round(acc(preds["held-out seeds"][0.2])[0], 4),
            "held_out_configs_accuracy": round(acc(preds["held-out configs"][0.2])[0], 4),
            "baseline_accuracy": round(acc(preds["baseline"][0.2])[0], 4),
            "n_heads": acc(preds["baseline"][0.2])[1], "command": COMMAND,
            "fresh_seeds": args.confirm, "fresh_runs": len(confirm_runs),
            "fresh_accuracy": round(acc(confirm["forecaster (fit on all)"][0.2])[0], 4),
            "fresh_baseline_accuracy": round(acc(confirm["baseline"][0.2])[0], 4),
            "doc": "docs/benchmarks.md#forecasting-final-roles-issue-14"}
        f = final
        f.measured = measured
        from headwise.training.safetensors_io import write_bytes_atomic

        write_bytes_atomic(OUT, f.to_json().encode())
        print(f"written: {OUT.relative_to(ROOT)} ({measured})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
