"""The public contract suite run one spec at a time: what the suite benchmarks share.

``run_one`` trains one suite spec in this process (a worker's body: the benchmarks start one
worker per run, ``bench.lab.workers``) and returns what their tables read: clauses held,
steps, task metrics, wall time, and the seconds spent in the ``Enforcer`` callback (timed by
wrapping ``Enforcer.__call__`` in the worker's process). ``STAGES`` spells the candidate
levers of ``EnforceConfig.carrier_stages`` as the benchmarks name them. A benchmark that
compares enforcement variants spawns one enforced run per (spec, variant) with
``spawn_enforced`` and answers it with ``work_enforced``, each run in its own process.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from bench.lab.workers import ROOT, module_command, run_worker

SUITE = ROOT / "headwise" / "examples" / "suite"  # the suite's specs


def run_one(spec: Path, enforce: bool, out: Path, config: Any = None, seed: int | None = None,
            fresh: int | None = None, overrides: Sequence[str] = (),
            budget: float | None = None) -> dict[str, Any]:
    """Train ``spec`` once (in this process) and return what the table needs.

    ``config`` is the ``EnforceConfig`` of the enforced run (default: the library's; its
    ``dual`` may be another update rule). ``seed`` replaces ``train.seed`` (``--seed``);
    ``fresh``: the trained model is verified again on a verification set drawn from that
    seed (``headwise verify RUN --fresh SEED``), recorded per clause beside the run's own.
    ``overrides``: ``--set`` items applied to the spec (``data.verify_examples=2048``).
    ``budget``: the enforced run's ``--enforce-budget`` (default: none, the spec's steps).
    """
    import hashlib

    import torch

    from headwise.contract import EnforceConfig, Enforcer, task_learned
    from headwise.pipeline import RunOptions, held_out_mixture, train_run
    from headwise.pipeline.reverify import reverify_run
    from headwise.training import evaluate

    torch.set_num_threads(1)
    timings: list[float] = []
    call = Enforcer.__call__

    def timed(self: Any, state: Any) -> None:
        start = time.perf_counter()
        call(self, state)
        timings.append(time.perf_counter() - start)

    Enforcer.__call__ = timed  # type: ignore[method-assign]  # this worker process only
    start = time.perf_counter()
    outcome = train_run(spec, out, RunOptions(enforce=enforce, overwrite=True, progress=False,
                                              seed=seed, overrides=tuple(overrides) or None,
                                              enforce_config=config or EnforceConfig(),
                                              enforce_budget=budget if enforce else None))
    wall = time.perf_counter() - start
    compiled = outcome.compiled
    spec_data = compiled.spec.data
    record = evaluate(compiled.model, held_out_mixture(compiled.spec, "verify"), batch_size=256,
                      n_batches=2, seed=spec_data.verify_seed)
    verdict = outcome.contract
    assert verdict is not None
    enforcement = outcome.enforcement or {}
    at_kept = enforcement.get("enforcement_set") or {}
    again = {} if fresh is None else {
        r.clause.index: r for r in reverify_run(spec, out, fresh)[0].results}
    saturated = {c["index"] for c in enforcement.get("clauses") or [] if c.get("saturated")}
    unlearned = {r.clause.task for r in verdict.results if task_learned(r) is False}
    # evaluation points at which a clause failed with its multiplier at the cap
    capped_failing = [p["step"] for p in enforcement.get("history") or []
                      if any(not c["passed"] and c["saturated"] for c in p["clauses"].values())]
    digest = hashlib.sha256()  # the trained weights, to show two commits train the same model
    for name, tensor in sorted(compiled.model.state_dict().items()):
        digest.update(name.encode())
        digest.update(tensor.detach().cpu().contiguous().numpy().tobytes())
    return {
        "weights_sha256": digest.hexdigest(),
        "spec": spec.stem, "enforce": enforce, "wall_s": wall, "verify_s": sum(timings),
        "evaluations": len(timings), "steps": outcome.train.step,
        "kept_step": enforcement.get("kept_step", outcome.train.step),
        "max_steps": compiled.spec.train.steps,
        "held": sum(r.passed for r in verdict.results), "n_clauses": len(verdict.results),
        "certified": sum(r.state == "certified" for r in verdict.results),
        "contract_certified": verdict.certified, "seed": seed, "fresh_seed": fresh,
        "capped_failing_at": capped_failing,
        "held_enforcement_set": at_kept.get("passed"),
        "attempts": [{k: a[k] for k in ("lr", "steps", "kept_as")}
                     for a in enforcement.get("attempts") or []],
        "attempt": enforcement.get("attempt", 1),
        "clauses": [{"index": r.clause.index, "name": r.clause.label,
                     "kind": r.clause.kind, "threshold": r.clause.threshold_text(),
                     "measured": r.measured, "passed": r.passed, "state": r.state,
                     "bound": None if r.bound is None else r.bound.text(),
                     "examples": None if r.bound is None else r.bound.examples,
                     "needed": None if r.bound is None else r.bound.needed,
                     "saturated": r.clause.index in saturated,
                     "task_learned": None if r.clause.task is None
                     else r.clause.task not in unlearned,
                     "fresh": None if not again else {
                         "measured": again[r.clause.index].measured,
                         "state": again[r.clause.index].state}}
                    for r in verdict.results],
        "tasks": {t: {"accuracy": v["accuracy"], "exact": v["exact"]}
                  for t, v in record["tasks"].items()},
        "multipliers": (outcome.enforcement or {}).get("clauses") and {
            str(c["index"]): c["multiplier"] for c in outcome.enforcement["clauses"]},
    }


STAGES = {"others>margin": (("others",), ("margin",)), "others+margin": (("others", "margin"),),
          "others": (("others",),), "margin": (("margin",),)}


def spawn_enforced(module: str, spec: Path, variant: str, tmp: Path) -> dict[str, Any]:
    """One enforced run of ``spec`` under ``variant`` in a fresh process of ``module`` (its
    ``--worker SPEC OUT VARIANT`` calls ``work_enforced``); the run's ``run_one`` record."""
    out = tmp / f"{spec.stem}-{variant.replace('+', '_')}"
    return run_worker(module_command(module, "--worker", spec, out, variant),
                      f"{spec.stem} ({variant})")


def work_enforced(worker: Sequence[str], config: Callable[[str], Any]) -> None:
    """The worker of ``spawn_enforced``: ``worker`` is (SPEC, OUT, VARIANT); prints the enforced
    run's record, ``config(VARIANT)`` its ``EnforceConfig`` (``None``: the library's)."""
    spec, out, variant = worker
    print(json.dumps(run_one(Path(spec), True, Path(out), config(variant))))
