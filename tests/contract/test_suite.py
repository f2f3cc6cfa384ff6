"""The public contract suite (``headwise/examples/suite``): plans, and enforcement per clause kind.

Fast: ``headwise plan`` exits 0 on every suite spec (every clause has a lever). Slow: for each
clause kind, a suite spec whose plain run *fails* that clause and whose ``--enforce`` run
*holds* it, both judged on the verification set (which enforcement never reads) and
re-checked here against the clause's bound (``bench/contract_suite.py`` runs the whole
suite; docs/benchmarks.md).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from headwise.cli import main
from headwise.pipeline.options import RunOptions
from headwise.pipeline.run import train_run
from headwise.runspec import load_spec

SUITE = Path(__file__).resolve().parents[2] / "headwise" / "examples" / "suite"
SPECS = sorted(SUITE.glob("*.yaml"))


def test_suite_covers_every_clause_kind_and_enough_tasks() -> None:
    kinds: set[str] = set()
    tasks: set[str] = set()
    for path in SPECS:
        spec = load_spec(path)
        tasks |= {t.task for t in spec.data.tasks}
        for c in spec.contract:
            bound = "at_least" if c.at_least is not None else "at_most"
            kinds.add({"exclusive": "exclusive", "score": f"score {bound}",
                       "ablation": f"drop_{bound}", "task": f"task {c.metric}",
                       "path": f"path drop_{bound}",
                       "circuit": "circuit keeps" if c.at_least is not None
                       else "circuit outside"}[c.kind])
    assert len(SPECS) >= 12 and len(tasks) >= 5, (len(SPECS), tasks)
    assert kinds == {"score at_least", "score at_most", "drop_at_least", "drop_at_most",
                     "exclusive", "task accuracy", "task exact", "task loss",
                     "path drop_at_least", "circuit keeps", "circuit outside"}


@pytest.mark.parametrize("path", SPECS, ids=[p.stem for p in SPECS])
def test_plan_finds_a_lever_for_every_clause(path: Path,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", str(path)]) == 0
    assert "(no lever)" not in capsys.readouterr().out


# (spec, clause index, clause kind): a clause a plain run fails and --enforce holds.
CASES = [
    ("copy_prev_token", 0, "score at_least (previous_token)"),
    ("bracket_one_counter", 1, "score at_most (entropy)"),
    ("reverse_split", 1, "ablation drop_at_least"),
    ("copy_carrier", 0, "ablation drop_at_least (a redundant pair)"),
    ("copy_sort_spare", 1, "ablation drop_at_most"),
    ("copy_sort_exclusive", 0, "exclusive"),
    ("sort_copy_floors", 1, "task floor (exact)"),
]


@pytest.mark.slow
@pytest.mark.parametrize(("name", "index", "kind"), CASES, ids=[c[2] for c in CASES])
def test_enforce_holds_a_clause_the_plain_run_fails(tmp_path: Path, name: str, index: int,
                                                    kind: str) -> None:
    spec = SUITE / f"{name}.yaml"
    plain = train_run(spec, tmp_path / "plain", RunOptions(progress=False)).contract
    enforced = train_run(spec, tmp_path / "enf", RunOptions(enforce=True, progress=False))
    assert plain is not None and enforced.contract is not None
    before, after = plain.results[index], enforced.contract.results[index]
    clause = before.clause
    assert not before.passed and after.passed, (kind, before.measured, after.measured)
    # The verdicts agree with the clause's bound (the measured value, read independently).
    value = after.measured
    assert value is not None
    if clause.kind == "exclusive":
        assert value >= (clause.at_least or 0.0)
        assert after.details["others_max"] <= (clause.at_most or 0.0)
    else:
        assert clause.at_least is None or value >= clause.at_least
        assert clause.at_most is None or value <= clause.at_most
    # The whole contract holds with --enforce; training ran its budget and kept the model of
    # the last evaluation point certified on the enforcement set (else the last past every
    # guard, else the last at which the contract held there).
    assert enforced.contract.passed and enforced.enforcement is not None
    assert enforced.train.step == load_spec(spec).train.steps
    kept = enforced.enforcement["kept_step"]
    tiers = [(p["step"], 2 if p.get("certified") else 1 if p.get("confident") else 0)
             for p in enforced.enforcement["history"] if p["passed"]]
    best = max(t for _, t in tiers)
    assert [step for step, t in tiers if t == best][-1] == kept
