"""Clause trajectories of the public contract suite: every clause's value at every evaluation
point, plain and under ``--enforce``, per training seed; the data clause-verdict forecasts are
fit and scored on (``bench_clause_forecast.py``).

Each (spec, seed, mode) is one subprocess with one torch thread running ``train_run`` with
``seed`` (the spec's ``train.seed``; data and its held-out sets keep the spec's seeds). The
enforced run records the contract on the enforcement set at each evaluation point itself
(``enforcement.json``'s history). The plain run is the same call with an ``Enforcer`` whose
multipliers never leave 0 (``MeasureOnly``: no dual step, no back-off, the final model kept),
so every lever weighs 0 and nothing is ablated: it trains as a plain run does, up to
rounding (its lever hooks stay attached, and a hooked short sequence takes the explicit
attention path: final values agree with a plain ``headwise train`` to ~4 digits), and measures
the contract at the same points.
The outcome of a clause is its verdict on the verification set at the end: the final model's
for a plain run, the kept model's under ``--enforce`` (what ``contract.json`` reports). Each
record also keeps the run's held-out task loss at each evaluation point (``"losses"``).

One JSON file per run in ``--out`` (default ``bench/.cache/clause_traj``, git-ignored); a
finished run is not rerun. ``--configs`` trains the forecast benchmark's configurations with
their contracts (``bench.lab.config_contracts``) instead of the suite (default ``--out``
``bench/.cache/clause_traj_configs``; each record says which with ``"suite"``).

    OMP_NUM_THREADS=1 .venv/bin/python -m bench.forecasting.clause_trajectories \
        --seeds 0 1 [--only SPEC ...] [--configs] [--jobs 2] [--out DIR]
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from bench.lab.clause_scoring import DEFAULT_DATA
from bench.lab.config_contracts import write_specs
from bench.lab.metrics import metrics_curve
from bench.lab.suite import SUITE
from bench.lab.workers import BENCH, ONE_THREAD, module_command, run

CONFIGS_OUT = BENCH / ".cache" / "clause_traj_configs"


def measure_only() -> Any:
    """A ``DualUpdate`` that never moves a multiplier off 0, and keeps the final model: the
    enforcer measures and records, as a plain run trains."""
    from dataclasses import dataclass

    @dataclass(frozen=True)
    class MeasureOnly:
        keeps_held_model: bool = False

        def update(self, lambdas: dict[int, float], violations: Any, ctx: Any) -> None:
            for index in violations:
                lambdas[index] = 0.0

    return MeasureOnly()


def run_one(spec: Path, seed: int, enforce: bool, out: Path) -> dict[str, Any]:
    """Train once in this process; the clauses, their trajectories and outcomes."""
    import dataclasses

    import torch

    from headwise.pipeline import RunOptions, train_run
    from headwise.runspec import load_spec

    torch.set_num_threads(1)
    start = time.perf_counter()
    config = None if enforce else dataclasses.replace(load_spec(spec).enforce,
                                                      dual=measure_only())
    outcome = train_run(spec, out, RunOptions(enforce=True, overwrite=True, progress=False,
                                              seed=seed, enforce_config=config))
    wall = time.perf_counter() - start
    record = outcome.train.extra["enforce"]
    verdict = outcome.contract
    assert verdict is not None
    model: Any = outcome.compiled.model.config
    clauses = []
    for r in verdict.results:
        c, key = r.clause, str(r.clause.index)
        points = [(p["step"], p["clauses"][key]["measured"], p["clauses"][key]["stderr"])
                  for p in record["history"] if key in p["clauses"]]
        clauses.append({
            "index": c.index, "name": c.label, "kind": c.kind, "describe": c.describe(),
            "metric": c.metric, "score": c.score, "task": c.task,
            "at_least": c.at_least, "at_most": c.at_most,
            "steps": [p[0] for p in points], "values": [p[1] for p in points],
            "stderrs": [p[2] for p in points],
            "final": r.measured, "holds": r.passed})
    return {"spec": spec.stem, "suite": "suite" if spec.parent == SUITE else "configs",
            "seed": seed, "mode": "enforced" if enforce else "plain",
            "total_steps": outcome.compiled.spec.train.steps, "wall_s": wall,
            "model": {"n_layers": model.n_layers, "n_heads": model.n_heads,
                      "d_model": model.d_model},
            "tasks": sorted({t.task for t in outcome.compiled.spec.data.tasks}),
            "clauses": clauses, "losses": losses(out)}


def losses(run_dir: Path) -> dict[str, list[Any]]:
    """The run's held-out task loss (overall and per task) at each evaluation point, from its
    ``metrics.jsonl`` (``metrics_curve``)."""
    return {"eval": [[r["step"], r["loss"], {name: t["loss"] for name, t in r["tasks"].items()}]
                     for r in metrics_curve(run_dir)]}


def spawn(spec: Path, seed: int, enforce: bool, out_dir: Path) -> dict[str, Any]:
    target = out_dir / f"seed{seed}" / f"{spec.stem}-{'enforced' if enforce else 'plain'}.json"
    if target.exists():
        result: dict[str, Any] = json.loads(target.read_text())
        return result
    with tempfile.TemporaryDirectory() as tmp:
        cmd = module_command(__spec__.name, "--worker", spec, seed, tmp)
        if enforce:
            cmd.append("--enforce")
        proc = run(cmd, ONE_THREAD)
    if proc.returncode != 0:
        raise RuntimeError(f"{spec.stem} seed {seed} enforce={enforce}:\n{proc.stderr[-3000:]}")
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp_target = target.with_suffix(".tmp")
    tmp_target.write_text(json.dumps(result))
    tmp_target.replace(target)
    print(f"{spec.stem} seed {seed} {result['mode']}: "
          f"{sum(c['holds'] for c in result['clauses'])}/{len(result['clauses'])} held, "
          f"{result['wall_s']:.0f} s", flush=True)
    return result


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    p.add_argument("--only", nargs="+", default=None)
    p.add_argument("--jobs", type=int, default=1)
    p.add_argument("--configs", action="store_true",
                   help="the forecast benchmark's configurations with their contracts")
    p.add_argument("--out", type=Path, default=None)
    p.add_argument("--worker", nargs=3, metavar=("SPEC", "SEED", "OUT"), default=None)
    p.add_argument("--enforce", action="store_true")
    args = p.parse_args()
    if args.worker:
        spec, seed, out = args.worker
        print(json.dumps(run_one(Path(spec), int(seed), args.enforce, Path(out) / "run")))
        return
    out = args.out or (CONFIGS_OUT if args.configs else DEFAULT_DATA)
    if args.configs:
        specs = write_specs(out / "specs")
    else:
        specs = sorted(SUITE.glob("*.yaml"))
    if args.only:
        specs = [s for s in specs if s.stem in set(args.only)]
    jobs = [(s, seed, enforce) for seed in args.seeds for s in specs for enforce in (False, True)]
    with ThreadPoolExecutor(args.jobs) as pool:
        list(pool.map(lambda job: spawn(job[0], job[1], job[2], out), jobs))


if __name__ == "__main__":
    main()
