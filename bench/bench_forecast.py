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
``bench/forecast_signals.py``'s ``gradient_signals`` on the held-out mixture and cached
next to the trajectories (keyed by that module's code).

``--within`` adds forecasters fit within each configuration (on its other seeds only): an
estimate of what the signals can tell once a configuration's behaviour is known.

Per configuration at 20% it prints each forecaster against the baseline head by head (heads
only one of them gets right, with an exact sign test), and the calibration of the stated
probabilities.

    OMP_NUM_THREADS=1 .venv/bin/python bench/bench_forecast.py [--save] [--ablation] [--suite]
        [--within]
        [--seeds 0 1 2] [--confirm 5 6 7]   (default: seeds 0-19, fresh seeds 20-24)
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import yaml
from torch import Tensor

from headwise.analysis.role_table import SHOWN_MIN_SCORE, TOP_ROLE_CANDIDATES
from headwise.forecast.roles import NONE_FEATURES, ROLE_FEATURES

sys.path.insert(0, str(Path(__file__).resolve().parent))
from forecast_tables import (  # noqa: E402  (a sibling script module)
    FRACTIONS,
    NEAR,
    Preds,
    Row,
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

ROOT = Path(__file__).resolve().parents[1]
CACHE = ROOT / "bench" / ".cache" / "forecast"
OUT = ROOT / "headwise" / "data" / "forecaster_v2.json"
CHECKPOINTS = 20  # checkpoints per run (checkpoint_every = steps / 20)
COMMAND = "OMP_NUM_THREADS=1 .venv/bin/python bench/bench_forecast.py --save --ablation"
SUITE = ROOT / "headwise" / "examples" / "suite"

# Four base configurations: an induction circuit on random periods, a multi-task model
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


BASE = tuple(CONFIGS)  # the four configurations above; --suite adds "suite-<spec>" ones


def _suite_spec(path: Path) -> dict[str, Any]:
    """A suite spec with its text files' paths relative to where ``run_one`` writes the run's
    copy (``CACHE/runs/``), so the configuration, and the cache key, read the same in every
    checkout."""
    from headwise.runspec.yaml_io import parse_yaml

    spec = parse_yaml(path.read_text(), str(path))  # YAML 1.2: `on:` is a key, not True
    for task in spec["data"]["tasks"].values():
        if isinstance(task, dict) and "path" in task:
            task["path"] = os.path.relpath((path.parent / task["path"]).resolve(),
                                           CACHE / "runs")
    return spec


def suite_configs() -> dict[str, str]:
    """The contract suite's specs as configurations: contract, name and description removed,
    ``checkpoint_every = steps / CHECKPOINTS``, the seed a placeholder; a spec that trains
    exactly like an earlier one (only its contract differs) is left out."""
    out: dict[str, str] = {}
    seen: set[str] = set()
    for path in sorted(SUITE.glob("*.yaml")):
        spec = _suite_spec(path)
        for field in ("contract", "name", "description"):
            spec.pop(field, None)
        same = yaml.safe_dump(spec, sort_keys=True)
        if same in seen:
            continue
        seen.add(same)
        spec["train"]["checkpoint_every"] = spec["train"]["steps"] // CHECKPOINTS
        spec["train"]["seed"] = "SEED"
        out[f"suite-{path.stem}"] = yaml.safe_dump(spec, sort_keys=False)
    return out


def enforced_configs() -> dict[str, str]:
    """The contract suite's specs with their contracts, trained under ``--enforce``
    (``enforced-<spec>``), checkpointed like the others: the enforced runs role forecasts are
    fit and scored on (``bench/bench_role_scores.py``)."""
    out: dict[str, str] = {}
    for path in sorted(SUITE.glob("*.yaml")):
        spec = _suite_spec(path)
        for field in ("name", "description"):
            spec.pop(field, None)
        spec["train"]["checkpoint_every"] = spec["train"]["steps"] // CHECKPOINTS
        spec["train"]["seed"] = "SEED"
        out[f"enforced-{path.stem}"] = yaml.safe_dump(spec, sort_keys=False)
    return out


def code_key() -> str:
    """A hash of the package code that shapes a run's trajectory (training, model, data, role
    scores, probes) and of the configurations: cached runs are reused only while it holds.
    Forecast code, reports, the CLI and the trajectory container are left out (they do not
    change what a run's checkpoints score)."""
    h = hashlib.sha256()
    for path in sorted((ROOT / "headwise").rglob("*.py")):
        rel = path.relative_to(ROOT).as_posix()
        if (rel.startswith("headwise/cli/") or "/forecast" in rel
                or rel.startswith(("headwise/report/", "headwise/render/"))
                or rel == "headwise/analysis/trajectories.py"):
            continue
        h.update(rel.encode() + path.read_bytes())
    h.update(json.dumps(CONFIGS, sort_keys=True).encode())
    return h.hexdigest()[:12]


def signals_key() -> str:
    """A hash of the training signals' code (their files sit next to the runs' trajectories)."""
    code = (ROOT / "bench" / "forecast_signals.py").read_bytes()
    return hashlib.sha256(code).hexdigest()[:12]


def run_one(name: str, seed: int, key: str) -> dict:
    """Train one run (or read its cached trajectory) and return the cached record."""
    from headwise.pipeline.options import RunOptions
    from headwise.pipeline.run import train_run
    from headwise.pipeline.run_report import run_trajectory

    path = CACHE / key / f"{name}_s{seed}.json"
    if path.is_file():
        return json.loads(path.read_text())
    run_dir = CACHE / "runs" / f"{name}_s{seed}"
    run_dir.mkdir(parents=True, exist_ok=True)
    spec = run_dir.parent / f"{name}_s{seed}.yaml"
    spec.write_text(f"name: {name}\n" + CONFIGS[name].replace("SEED", str(seed)))
    t0 = time.perf_counter()
    outcome = train_run(spec, run_dir, RunOptions(
        overwrite=True, progress=False, enforce=name.startswith("enforced-"),
        warn=lambda _: None))
    traj = run_trajectory(run_dir, outcome.compiled)
    assert traj is not None
    record = {"config": name, "seed": seed, "total_steps": outcome.train.step,
              "seconds": time.perf_counter() - t0, "trajectory": traj.to_dict()}
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(record))
    print(f"  {name} seed {seed}: {record['seconds']:.0f} s, {len(traj.steps)} checkpoints, "
          f"final roles {[traj.final_role(h) for h in traj.heads]}", flush=True)
    return record


def with_signals(rec: dict, key: str) -> dict:
    """``rec`` with training signals in its trajectory, computed from the run's checkpoints
    (``gradient_signals`` on the held-out mixture, with the run's objectives) and cached."""
    from forecast_signals import gradient_signals

    from headwise.pipeline.finished import load_compiled
    from headwise.pipeline.heldout import enforcement_data
    from headwise.training.checkpoint import list_checkpoints
    from headwise.training.safetensors_io import load_weights

    name, seed = rec["config"], rec["seed"]
    path = CACHE / key / f"{name}_s{seed}.signals_{signals_key()}.json"
    if not path.is_file():
        run_dir = CACHE / "runs" / f"{name}_s{seed}"
        compiled = load_compiled(run_dir)
        data, t0 = enforcement_data(compiled), time.perf_counter()
        out: dict[str, Any] = {"steps": [], "loss": [], "alignment": [], "param_alignment": []}
        for step, ckpt in list_checkpoints(run_dir):
            load_weights(compiled.model, ckpt / "model.safetensors")
            sig = gradient_signals(compiled.model, data.probes["default"], compiled.objectives)
            out["steps"].append(step)
            out["loss"].append(sig.loss)
            out["alignment"].append(sig.alignment.tolist())
            out["param_alignment"].append(sig.param_alignment.tolist())
        out["seconds"] = time.perf_counter() - t0
        path.write_text(json.dumps(out))
    sig = json.loads(path.read_text())
    traj = rec["trajectory"]
    if sig["steps"] != traj["steps"]:
        raise SystemExit(f"{path}: checkpoint steps differ from the cached trajectory's; delete "
                         f"{CACHE / 'runs' / f'{name}_s{seed}'} and its cache files to retrain")
    def series(key: str, i: int) -> dict[str, list[float | None]]:
        return {r: [sig[key][c][i][j] for c in range(len(sig["steps"]))]
                for j, r in enumerate(TOP_ROLE_CANDIDATES)}

    heads = [{**h, "alignment": series("alignment", i),
              "param_alignment": series("param_alignment", i)}
             for i, h in enumerate(traj["heads"])]
    return {**rec, "signal_seconds": sig["seconds"],
            "trajectory": {**traj, "loss": sig["loss"], "heads": heads}}


def load_runs(seeds: list[int], key: str) -> list[dict]:
    """Every configuration's run for ``seeds`` (seeds outermost: an interrupted benchmark has
    every configuration of the seeds it finished), with its ``Trajectory`` as ``traj``."""
    from forecast_signals import attach_signals, signals_from_dict

    from headwise.analysis.trajectories import Trajectory

    runs = []
    for seed in seeds:
        for name in CONFIGS:
            rec = with_signals(run_one(name, seed, key), key)
            traj = Trajectory.from_dict(rec["trajectory"])
            signals = signals_from_dict(rec["trajectory"])
            assert signals is not None  # with_signals added them
            runs.append({**rec, "traj": attach_signals(traj, signals)})
    return runs


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
    from headwise.forecast.roles import _candidate_values, _top, lead, onehot

    y = _candidate_values(traj)[:n]
    tops = [_top(y[c], SHOWN_MIN_SCORE) for c in range(n)]
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
    from headwise.forecast.roles import _fit_lines

    z = torch.nan_to_num(y)
    seen, n = float(x[-1]), len(x)
    a, b = _fit_lines(x, y)
    linear = torch.nan_to_num((a + b).clamp(0.0, 1.0))
    gain = torch.nan_to_num(b * (1.0 - seen)).clamp(-1.0, 1.0)
    start = z[0].clamp_min(0.02)
    accel = torch.zeros_like(gain)
    if n >= 3:
        half = n // 2
        _, b1 = _fit_lines(x[:half + 1], y[:half + 1])
        _, b2 = _fit_lines(x[half:], y[half:])
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


# Feature sets scored side by side with --ablation (the packaged forecaster: the first).
SCORES = (list(ROLE_FEATURES), list(NONE_FEATURES))
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
    from headwise.forecast.roles import _candidate_values

    top = torch.nan_to_num(_candidate_values(r["traj"])[-1], nan=0.0).max(1).values  # (N,)
    return [abs(float(v) - SHOWN_MIN_SCORE) < NEAR for v in top]


def score(predictor: Predictor, rs: list[dict]) -> dict[float, Rows]:
    """The predictor's forecasts for every head of runs ``rs`` at every fraction."""
    return {frac: [Row(r["config"], r["seed"], str(h), t, p, near, conf) for r in rs
                   for h, t, (p, conf), near in zip(r["traj"].heads, truth(r),
                                                    predictor(r, frac), near_threshold(r),
                                                    strict=True)]
            for frac in FRACTIONS}


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
