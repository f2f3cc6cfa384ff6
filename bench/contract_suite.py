"""The public contract suite, each spec trained plain and with ``--enforce``.

Every spec in ``headwise/examples/suite/`` is trained twice, each in its own subprocess with one
torch thread: plainly (``train_run``) and with enforcement (``RunOptions(enforce=True)``). In
the enforced run each call of the ``Enforcer`` callback is timed (the worker wraps
``Enforcer.__call__`` in its own process), to measure the share of its wall time spent
verifying the contract at evaluation points. ``--set name=value`` sets a field of
``EnforceConfig``
(``carrier_stages`` as ``others>margin``, ``others+margin``, ``others`` or ``margin``);
``--variant halving`` enforces with the earlier floor rule (while a task clause fails, every
other multiplier is halved before its step) and ``--variant none`` with no back-off at all
(the multipliers alone), for comparison with the library's rule (only the levers that degrade
a task whose floor fails back off).
``--spec-set PATH=VALUE`` overrides a field of every spec as ``headwise train --set`` does
(``data.verify_examples=2048``: every run verified on a larger set, training unchanged).
``--seed 0 1 2 3 4`` trains every spec at each of those ``train.seed`` values; ``--fresh OFFSET``
verifies each enforced run again on a verification set drawn from ``OFFSET + seed``
(``headwise verify RUN --fresh``), beside the run's own verdict. ``--enforce-budget F`` trains
each enforced run with ``headwise train --enforce-budget F`` (up to ``F x train.steps``).
Prints a markdown table: clauses held plain / enforced on the verification set, each enforced
clause's state there (certified / holds / fails, and on the fresh set), and enforced on
the enforcement set at the kept step, steps trained and the step kept, the tasks' accuracy and
exact match on the verification set, wall times, the share of the enforced run's time spent
measuring the contract, then the total share of clauses held and every clause not certified
on the verification set with ``--enforce``, with why (a failing one beside the plain run's
measure of it at the same seed: not learned plainly either, or lost to enforcement).

    python -m bench.contract_suite [--jobs 1] [--only NAME ...] [--json PATH] [--set NAME=VALUE]
        [--variant halving] [--seed SEED ...] [--fresh OFFSET] [--spec-set PATH=VALUE]
        [--enforce-budget F]
    python -m bench.contract_suite --merge PART.json ...   # one table from several --json runs
                                                           # (or their .partial.jsonl files)

``--jobs 2`` runs two subprocesses at a time (faster on two cores, but each wall time then
includes contention: compare only ratios measured the same way).
"""

from __future__ import annotations

import argparse
import json
import tempfile
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from bench.lab.suite import STAGES, SUITE, run_one
from bench.lab.workers import module_command, run_worker
from headwise.render.numbers import fixed


def halving() -> Any:
    """The earlier floor rule, as a ``DualUpdate``: while a task clause fails on the
    enforcement set, every levered multiplier but the floors' is halved before its step."""
    from headwise.contract import ProjectedAscent

    class Halving(ProjectedAscent):
        def update(self, lambdas: dict[int, float], violations: Any, ctx: Any) -> None:
            if ctx.failing:
                for index in lambdas:
                    if index not in ctx.floors:
                        lambdas[index] *= 0.5
            for index, v in violations.items():
                lam = float(lambdas.get(index, 0.0))
                lambdas[index] = min(max(lam + ctx.eta * v, 0.0), ctx.lambda_max)

    return Halving()


def multipliers_alone() -> Any:
    """No back-off, as a ``DualUpdate``: each multiplier follows its own violation only."""
    from headwise.contract import ProjectedAscent

    class Alone(ProjectedAscent):
        def update(self, lambdas: dict[int, float], violations: Any, ctx: Any) -> None:
            for index, v in violations.items():
                lam = float(lambdas.get(index, 0.0))
                lambdas[index] = min(max(lam + ctx.eta * v, 0.0), ctx.lambda_max)

    return Alone()


VARIANTS = {"halving": halving, "none": multipliers_alone}


def enforce_config(sets: list[str], variant: str | None = None) -> Any:
    """The ``EnforceConfig`` that ``--set NAME=VALUE`` items (and a ``--variant``) describe."""
    import dataclasses

    from headwise.contract import EnforceConfig

    fields = {f.name for f in dataclasses.fields(EnforceConfig)} - {"dual"}
    values: dict[str, Any] = {}
    for item in sets:
        name, _, text = item.partition("=")
        if name not in fields:
            raise SystemExit(f"--set: EnforceConfig has no field {name!r}; expected one of "
                             f"{sorted(fields)}")
        values[name] = (STAGES[text] if name == "carrier_stages" else
                        text if name == "stop" else float(text))
    if variant:
        values["dual"] = VARIANTS[variant]()
    return EnforceConfig(**values)


def spawn(spec: Path, enforce: bool, tmp: Path, sets: list[str],
          variant: str | None = None, seed: int | None = None,
          fresh: int | None = None, spec_sets: Sequence[str] = (),
          budget: float | None = None) -> dict[str, Any]:
    """``run_one`` in a fresh subprocess (one thread, nothing shared between runs)."""
    out = tmp / f"{spec.stem}-{'enf' if enforce else 'plain'}-{seed}"
    cmd = module_command(__spec__.name, "--worker", spec, out)
    if seed is not None:
        cmd += ["--seed", str(seed)]
    if fresh is not None:
        cmd += ["--fresh", str(fresh)]
    if enforce:
        cmd.append("--enforce")
    if variant:
        cmd += ["--variant", variant]
    for item in sets:
        cmd += ["--set", item]
    for item in spec_sets:
        cmd += ["--spec-set", item]
    if enforce and budget is not None:
        cmd += ["--enforce-budget", str(budget)]
    return run_worker(cmd, f"{spec.stem} (enforce={enforce})")


def _tasks(res: dict[str, Any]) -> str:
    return "; ".join(f"{t} {v['accuracy']:.3f} / {v['exact']:.3f}"
                     for t, v in res["tasks"].items())


def keep(json_path: Path | None, record: dict[str, Any]) -> dict[str, Any]:
    """Append one finished run's record to ``JSON.partial.jsonl`` beside ``--json`` (a long
    suite that stops part-way keeps what it measured), and return it."""
    if json_path is not None:
        with open(json_path.with_suffix(".partial.jsonl"), "a") as f:
            f.write(json.dumps(record) + "\n")
    return record


def read_pairs(path: Path) -> list[tuple[dict[str, Any], dict[str, Any]]]:
    """The (plain, enforced) pairs of a ``--json`` file, or of a ``.partial.jsonl`` file
    (the runs finished so far, one record per line; a spec and seed whose two runs are not
    both there is left out)."""
    if path.suffix != ".jsonl":
        return [tuple(pair) for pair in json.loads(path.read_text())]  # type: ignore[misc]
    runs = {(r["spec"], r.get("seed"), r["enforce"]): r
            for r in map(json.loads, path.read_text().splitlines())}
    return [(plain, runs[(spec, seed, True)]) for (spec, seed, enf), plain in runs.items()
            if not enf and (spec, seed, True) in runs]


def _states(res: dict[str, Any], fresh: bool = False) -> str:
    """``certified / holds / fails`` counts of a run's clauses (on the fresh set: ``fresh``)."""
    states = [(c["fresh"] or {}).get("state") if fresh else c.get("state")
              for c in res["clauses"]]
    if None in states:
        return "-"
    return "/".join(str(states.count(s)) for s in ("certified", "holds", "fails"))


def _why(clause: dict[str, Any], plain: dict[str, Any] | None) -> str:
    """Why an enforced clause is not certified, from its record: a lever at its cap, a clause
    still failing with its lever acting, or one that holds on a verification set too small to
    certify it at the measured margin (with the examples it has and would need). A failing
    clause is set beside the plain run's measure of it at the same seed (``plain``): a task
    floor the plain run fails too is a task that does not reach it plainly at that seed; a
    clause the plain run holds is lost to enforcement (traded against another clause's
    lever). A clause whose task learned nothing from its input at all (``task_learned``:
    no better than answering each position with its most common target) says so."""
    if clause.get("state") == "fails" or not clause["passed"]:
        why = "fails, lever saturated" if clause.get("saturated") else \
            "fails with its lever still acting"
        if clause.get("task_learned") is False:
            why = "fails: its task did not learn (no better than input-blind answers)"
        if plain is None or plain["measured"] is None:
            return why
        measured = fixed(plain["measured"])
        if plain["passed"]:
            return why + f"; the plain run holds it ({measured}): lost to enforcement"
        return why + f"; the plain run fails it too ({measured})" + (
            ": the task does not reach its floor plainly at this seed"
            if clause.get("kind") == "task"
            else "")
    if "needed" not in clause:  # a record from before the sizes were kept
        return "holds short of certification"
    have, need = clause["examples"], clause["needed"]
    if need is None:
        return f"holds on its bound ({have} examples; no size certifies this margin)"
    return f"holds short of certification: {have} examples, about {need} needed"


def table(results: list[tuple[dict[str, Any], dict[str, Any]]]) -> str:
    """The markdown table and the summary lines."""
    lines = ["| spec | seed | clauses held plain / enforced | enforced: certified / holds / "
             "fails (fresh set) | steps plain / enforced (of) "
             "| task acc / exact, plain | task acc / exact, enforced | wall s plain / enforced "
             "| contract measuring share of enforced |", "|---|---|---|---|---|---|---|---|---|"]
    held = total = plain_held = certified = fresh_certified = fresh_held = 0
    misses = []
    for plain, enf in results:
        held += enf["held"]
        plain_held += plain["held"]
        total += enf["n_clauses"]
        certified += sum(c.get("state") == "certified" for c in enf["clauses"])
        fresh_certified += sum((c.get("fresh") or {}).get("state") == "certified"
                               for c in enf["clauses"])
        fresh_held += sum((c.get("fresh") or {}).get("state") in ("certified", "holds")
                          for c in enf["clauses"])
        share = enf["verify_s"] / enf["wall_s"]
        on_enf = {True: "held", False: "failed", None: "never held"}[enf["held_enforcement_set"]]
        kept = f", kept {enf['kept_step']}" if enf["kept_step"] != enf["steps"] else ""
        if enf.get("attempts"):  # trained again at half the rate (headwise.contract.retry)
            steps = " + ".join(str(a["steps"]) for a in enf["attempts"])
            rates = ", ".join(f"{a['lr']:g}" for a in enf["attempts"])
            kept += f"; {steps} steps at lr {rates}, attempt {enf['attempt']} kept"
        lines.append(
            f"| {enf['spec']} | {enf.get('seed')} | {plain['held']}/{plain['n_clauses']} / "
            f"{enf['held']}/{enf['n_clauses']} (enforcement set: {on_enf}) | "
            f"{_states(enf)} ({_states(enf, fresh=True)}) | "
            f"{plain['steps']} / {enf['steps']}{kept} ({enf['max_steps']}) | "
            f"{_tasks(plain)} | {_tasks(enf)} | "
            f"{plain['wall_s']:.1f} / {enf['wall_s']:.1f} | {share:.1%} "
            f"({enf['evaluations']} evals) |")
        plain_clauses = {c["index"]: c for c in plain["clauses"]}
        for c in enf["clauses"]:
            if c.get("state", "fails" if not c["passed"] else "holds") != "certified":
                measured = "-" if c["measured"] is None else fixed(c["measured"])
                state = c.get("state", "holds" if c["passed"] else "fails")
                misses.append(f"- {enf['spec']} (seed {enf.get('seed')}) contract[{c['index']}] "
                              f"({c['name']}, {c['threshold']}): {state}, measured {measured}, "
                              f"bound {c.get('bound', '-')}, final multiplier "
                              f"{(enf['multipliers'] or {}).get(str(c['index']))}: "
                              f"{_why(c, plain_clauses.get(c['index']))}")
    lines.append("")
    lines.append(f"Clauses held: plain {plain_held}/{total} ({plain_held / total:.0%}), "
                 f"enforced {held}/{total} ({held / total:.0%}); enforced and certified "
                 f"{certified}/{total} ({certified / total:.0%}); on the fresh sets held "
                 f"{fresh_held}/{total}, certified {fresh_certified}/{total}.")
    lines.append("")
    lines.append("Not certified with --enforce:" if misses
                 else "Not certified with --enforce: none.")
    lines.extend(misses)
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=1)
    parser.add_argument("--only", nargs="+", default=None, help="spec names (file stems)")
    parser.add_argument("--json", type=Path, default=None, help="write the raw results here")
    parser.add_argument("--set", action="append", default=[], metavar="NAME=VALUE",
                        help="set a field of EnforceConfig (repeatable)")
    parser.add_argument("--spec-set", action="append", default=[], metavar="PATH=VALUE",
                        help="override a field of every spec, as `headwise train --set` "
                             "(repeatable), e.g. data.verify_examples=2048")
    parser.add_argument("--enforce-budget", type=float, default=None, metavar="F",
                        help="the enforced runs' --enforce-budget (1 to 1.3)")
    parser.add_argument("--variant", choices=sorted(VARIANTS), default=None,
                        help="enforce with an earlier rule, for comparison")
    parser.add_argument("--seed", type=int, nargs="+", default=[None], metavar="SEED",
                        help="train.seed of every run (several: the suite at each seed)")
    parser.add_argument("--fresh", type=int, default=None, metavar="OFFSET",
                        help="verify each enforced run again on a fresh set drawn from seed "
                             "OFFSET + its training seed (headwise verify --fresh)")
    parser.add_argument("--merge", nargs="+", type=Path, default=None, metavar="JSON",
                        help="print one table from the --json files of several runs")
    parser.add_argument("--worker", nargs=2, metavar=("SPEC", "OUT"), help=argparse.SUPPRESS)
    parser.add_argument("--enforce", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        seed = args.seed[0]
        print(json.dumps(run_one(Path(args.worker[0]), args.enforce, Path(args.worker[1]),
                                 enforce_config(args.set, args.variant), seed, args.fresh,
                                 args.spec_set, args.enforce_budget)))
        return
    from headwise.pipeline.options import ENFORCE_BUDGET_MAX

    if args.enforce_budget is not None and not 1.0 <= args.enforce_budget <= ENFORCE_BUDGET_MAX:
        parser.error(f"--enforce-budget: got {args.enforce_budget:g}, expected a number in "
                     f"[1, {ENFORCE_BUDGET_MAX:g}]")
    if args.merge:
        parts = [pair for f in args.merge for pair in read_pairs(f)]
        print(table(sorted(parts, key=lambda pair: (pair[0]["spec"],  # type: ignore[arg-type]
                                                    pair[0].get("seed") or 0))))
        return
    specs = sorted(SUITE.glob("*.yaml"))
    if args.only:
        specs = [s for s in specs if s.stem in args.only]
        if not specs:
            parser.error(f"--only: no suite spec named {args.only}; "
                         f"expected some of {sorted(p.stem for p in SUITE.glob('*.yaml'))}")
    with tempfile.TemporaryDirectory() as tmp, ThreadPoolExecutor(args.jobs) as pool:
        jobs = [(s, e, seed) for seed in args.seed for s in specs
                for e in (False, True)]  # interleaved plain / enforced
        done = list(pool.map(lambda job: keep(args.json, spawn(
            job[0], job[1], Path(tmp), args.set, args.variant, job[2],
            None if args.fresh is None or not job[1] else args.fresh + (job[2] or 0),
            args.spec_set, args.enforce_budget)), jobs))
    by = {(r["spec"], r["enforce"], r["seed"]): r for r in done}
    results = [(by[(s.stem, False, seed)], by[(s.stem, True, seed)])
               for s in specs for seed in args.seed]
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))
    print(table(results))


if __name__ == "__main__":
    main()
