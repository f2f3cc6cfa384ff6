"""The suite table says why an enforced clause is not certified, and sets a failing clause beside
the plain run's measure of it at the same seed: a task the plain run did not learn either is
told apart from one enforcement lost."""

from __future__ import annotations

from typing import Any

from bench.contract_suite import table


def _run(enforce: bool, measured: float, passed: bool, state: str,
         kind: str = "task", learned: bool | None = True) -> dict[str, Any]:
    clause = {"index": 0, "name": "sums right", "kind": kind, "threshold": ">= 0.9",
              "measured": measured, "passed": passed, "state": state, "saturated": enforce,
              "bound": ">= 0.1", "fresh": None, "task_learned": learned}
    return {"spec": "s", "seed": 2, "held": int(passed), "n_clauses": 1, "clauses": [clause],
            "verify_s": 1.0, "wall_s": 2.0, "held_enforcement_set": passed, "kept_step": 400,
            "steps": 400, "max_steps": 400, "tasks": {}, "evaluations": 31,
            "multipliers": {"0": 16.0} if enforce else None}


def test_a_floor_the_plain_run_fails_too_is_not_reached_at_that_seed() -> None:
    text = table([(_run(False, 0.745, False, "fails"), _run(True, 0.856, False, "fails"))])
    assert ("contract[0] (sums right, >= 0.9): fails, measured 0.856, bound >= 0.1, final "
            "multiplier 16.0: fails, lever saturated; the plain run fails it too (0.745): "
            "the task does not reach its floor plainly at this seed") in text


def test_a_task_that_learned_nothing_from_its_input_is_named_so() -> None:
    text = table([(_run(False, 0.145, False, "fails", learned=False),
                   _run(True, 0.156, False, "fails", learned=False))])
    assert ("multiplier 16.0: fails: its task did not learn (no better than input-blind "
            "answers); the plain run fails it too (0.145)") in text


def test_a_floor_the_plain_run_holds_is_lost_to_enforcement() -> None:
    text = table([(_run(False, 1.0, True, "holds"), _run(True, 0.152, False, "fails"))])
    assert "the plain run holds it (1.000): lost to enforcement" in text
    assert "plain 1/1 (100%), enforced 0/1 (0%); enforced and certified 0/1 (0%)" in text


def test_a_head_clause_the_plain_run_fails_too_is_not_called_a_task() -> None:
    text = table([(_run(False, 0.3, False, "fails", "score"),
                   _run(True, 0.31, False, "fails", "score"))])
    assert text.rstrip().endswith("fails, lever saturated; the plain run fails it too (0.300)")
