"""The clause-verdict watch: what it measures or reads at each evaluation point, when it
forecasts, which clauses it warns about and what the warning says."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from headwise.contract import parse_contract
from headwise.contract.clause_watch import ClauseWatch
from headwise.contract.results import ClauseResult, ContractResult
from headwise.forecast.clauses import ClauseForecaster, ClauseForecasters, ClauseTrajectory

CONTRACT = parse_contract([
    {"name": "rises", "head": "L0.H0", "score": "previous_token", "at_least": 0.6},
    {"name": "stays low", "head": "L0.H1", "score": "previous_token", "at_least": 0.6},
    {"task": "copy", "metric": "accuracy", "at_least": 0.5},
], 1, 2, ["copy"])
TOTAL = 100


def forecasters() -> ClauseForecasters:
    """Forecasters fit on straight-line runs: a clause holds iff its line ends >= its bound."""
    runs = []
    for i in range(40):
        start, end = (i % 8) / 8, ((i * 3) % 11) / 10
        values = tuple(start + (end - start) * s / TOTAL for s in range(10, TOTAL + 1, 10))
        runs.append(ClauseTrajectory(tuple(range(10, TOTAL + 1, 10)), values, (0.01,) * 10,
                                     0.6, None, TOTAL, False, 0.0, 1.0, final=end,
                                     holds=end >= 0.6,
                                     context={"n_layers": 1, "n_heads": 2, "tasks": ["copy"],
                                              "kind": "score"}))
    return ClauseForecasters((ClauseForecaster.fit(runs, 0.2), ClauseForecaster.fit(runs, 0.4)),
                             {"fresh": {"0.2": {"accuracy": 0.9}, "0.4": {"accuracy": 0.93}},
                              "configs": {"0.2": {"accuracy": 0.85}}})


def results(step: int) -> ContractResult:
    """L0.H0 rises to 1.0 over the run, L0.H1 sinks from 0.3, the task sits at 0.9."""
    values = [step / TOTAL, 0.3 - 0.2 * step / TOTAL, 0.9]
    return ContractResult([ClauseResult(c, v >= 0.6, v, c.threshold_text(), "", stderr=0.01)
                           for c, v in zip(CONTRACT, values, strict=True)])


def state(step: int, extra: dict[str, Any]) -> Any:
    return SimpleNamespace(step=step, rank=0, model=step, extra=extra)


def test_plain_run_measures_each_point_and_warns_on_the_clause_forecast_to_fail() -> None:
    warnings: list[str] = []
    asked: list[int] = []

    def advice() -> dict[int, str]:
        asked.append(1)
        return {1: "pattern objective (previous_token, ce) on L0.H1"}

    watch = ClauseWatch(CONTRACT, lambda step: results(step), TOTAL, 20, forecasters(),
                        {"n_layers": 1, "n_heads": 2, "tasks": ["copy"]}, advice,
                        warnings.append)
    extra: dict[str, Any] = {}
    for step in range(10, TOTAL + 1, 10):
        watch(state(step, extra))
    record = extra["clause_watch"]
    assert [p["step"] for p in record["history"]] == list(range(10, TOTAL + 1, 10))
    assert record["history"][1]["clauses"]["0"]["measured"] == pytest.approx(0.2)
    steps = sorted({f["step"] for f in record["forecasts"]})
    # every 20 steps from the first multiple on, never at the end (nothing left to forecast)
    assert steps == [20, 40, 60, 80]
    assert all("contract[1]" in w for w in warnings) and len(warnings) == len(steps)
    assert all("\n" not in w for w in warnings)  # one line per clause per point
    for w in warnings:  # forecast to fail (P < 0.5): the value printed fails the bound too
        value = float(w.split("final value ")[1].split(" ")[0])
        assert float(w.split("P(holds at the end) ")[1][:4]) < 0.5 and value < 0.6
    first = warnings[0]
    assert first.startswith("clause forecast at step 20: contract[1] 'stays low'")
    assert "--enforce would add: pattern objective (previous_token, ce) on L0.H1" in first
    measured = ("right on 90% of clause verdicts of suite runs it was not fit on, 85% of the "
                "role-forecast benchmark's runs it was not fit on]")
    assert measured in first
    # quoted again only when the model of a larger fraction takes over (0.2 at 20 -> 0.4 at 40)
    assert ["was right on" in w for w in warnings] == [True, True, False, False]
    assert "from 40% of the budget was right on 93%" in warnings[1]
    assert asked == [1]  # the plan is made once, at the first warning
    late = [f for f in record["forecasts"] if f["step"] == 80]
    assert {f["model_fraction"] for f in late} == {0.4}  # the largest fraction seen
    rises = next(f for f in late if f["clause"] == "contract[0]")
    assert rises["probability"] > 0.5


def test_enforced_run_reads_the_enforcers_history_and_gives_no_advice() -> None:
    warnings: list[str] = []
    watch = ClauseWatch(CONTRACT, None, TOTAL, 20, forecasters(),
                        {"n_layers": 1, "n_heads": 2, "tasks": ["copy"]}, None,
                        warnings.append)
    extra: dict[str, Any] = {"enforce": {"history": []}}
    for step in range(10, 41, 10):
        extra["enforce"]["history"].append({"step": step, "clauses": {
            str(r.clause.index): {"measured": r.measured, "stderr": r.stderr}
            for r in results(step).results}})
        watch(state(step, extra))
    assert extra["clause_watch"]["history"] == []  # nothing measured twice
    assert warnings and all("--enforce would add" not in w for w in warnings)
    # the forecaster was fit on plain runs only: an enforced run is outside its range
    assert all("plain runs only" in w for w in warnings)
