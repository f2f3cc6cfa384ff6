"""The forecast benchmark's runs: its configurations, trained once and cached, with training
signals.

``CONFIGS`` are four small configurations (an induction circuit, a multi-task model with task
gates, pattern objectives and masks on some heads, a bidirectional model); ``suite_configs`` and
``enforced_configs`` add the public contract suite's specs, plain and with their contracts.
``run_one`` trains one (configuration, seed) with checkpoints, scores every checkpoint with the
role-table function and caches the trajectory in ``bench/.cache/forecast/<code key>/``
(``code_key``: a finished run is not retrained while the code that shapes it is unchanged);
``load_runs`` adds each run's training signals (``bench.lab.forecast_signals``, cached beside
it, keyed by that module's code).
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from pathlib import Path
from typing import Any

import yaml

from bench.lab.suite import SUITE
from bench.lab.workers import BENCH, ROOT
from headwise.analysis import TOP_ROLE_CANDIDATES

CACHE = BENCH / ".cache" / "forecast"
CHECKPOINTS = 20  # checkpoints per run (checkpoint_every = steps / 20)

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
    fit and scored on (``bench.forecasting.bench_role_scores``)."""
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
    code = (BENCH / "lab" / "forecast_signals.py").read_bytes()
    return hashlib.sha256(code).hexdigest()[:12]


def run_one(name: str, seed: int, key: str) -> dict:
    """Train one run (or read its cached trajectory) and return the cached record."""
    from headwise.pipeline import RunOptions, train_run
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
    from bench.lab.forecast_signals import gradient_signals
    from headwise.pipeline.finished import load_compiled
    from headwise.pipeline.heldout import enforcement_data
    from headwise.training import list_checkpoints, load_weights

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
    from bench.lab.forecast_signals import attach_signals, signals_from_dict
    from headwise.analysis import Trajectory

    runs = []
    for seed in seeds:
        for name in CONFIGS:
            rec = with_signals(run_one(name, seed, key), key)
            traj = Trajectory.from_dict(rec["trajectory"])
            signals = signals_from_dict(rec["trajectory"])
            assert signals is not None  # with_signals added them
            runs.append({**rec, "traj": attach_signals(traj, signals)})
    return runs
