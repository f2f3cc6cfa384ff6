"""A pilot: a few plain training steps, to see which clauses and floors move before a long run.

``pilot(compiled, contract, steps)`` measures the contract on the enforcement set, trains the
compiled model for the first ``steps`` steps of its spec's own schedule in memory (warm-up and
learning rate as the full run would have them; no run directory, no levers driven), measuring
the contract at evaluation points on the way, and reports per clause its value before and
after, the signed change towards its bound, and the clause-verdict forecast of its value at
the end of the full budget (``headwise.forecast.clauses``, from the pilot's points). A clause
that does not move in a pilot where its task learns needs a lever (``--enforce``) or a
structural one (a mask, a gate); a floor that does not move is a task that is not learning.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any

from headwise.contract import Contract, ContractResult, verify
from headwise.contract.clause_watch import ClauseWatch
from headwise.forecast.clauses import ClauseForecast, load_clause_forecasters
from headwise.pipeline.compile import Compiled
from headwise.pipeline.heldout import enforcement_data
from headwise.training import train


@dataclass(frozen=True)
class PilotRow:
    """One clause in a pilot: its value before and after, and whether it moved towards its
    bound (``towards``: the decrease of its violation; > 0 is progress)."""

    index: int
    label: str
    before: float | None
    after: float | None
    towards: float
    holds: bool
    floor: bool
    forecast: ClauseForecast | None = None  # of the plain run's end (None: never measured)


def pilot(compiled: Compiled, contract: Contract, steps: int) -> list[PilotRow]:
    """Train ``compiled.model`` for the first ``steps`` steps of its spec's schedule (all of
    them when the budget is shorter) and report each clause's movement on the enforcement set
    and its forecast. The contract is measured every ``gcd(steps, train.eval_every)`` steps
    (every ``steps`` without evaluation points), so that the pilot ends on a measured point.

    Raises:
        SpecError: ``steps`` is not a valid number of steps.
    """
    from headwise.pipeline.run import check_steps

    spec_train = compiled.spec.train
    steps = min(check_steps(steps), spec_train.steps)
    every = math.gcd(steps, spec_train.eval_every or steps)
    config = dataclasses.replace(spec_train, eval_every=every, checkpoint_every=0)
    data = enforcement_data(compiled)
    before = verify(compiled.model, contract, data)
    watch = ClauseWatch(contract, lambda m: verify(m, contract, data, bounds=False),
                        spec_train.steps,
                        spec_train.steps + 1, load_clause_forecasters(),
                        compiled.spec.forecast_context,
                        None, lambda line: None)  # records every point, never warns

    def stop(state: Any) -> None:
        if state.step >= steps:
            state.stop = True

    result = train(compiled.model, compiled.data, config, objectives=compiled.objectives,
                   callbacks=[watch, stop], optimizer_hooks=compiled.optimizer_hooks,
                   progress=False)
    history = result.extra["clause_watch"]["history"]
    after = verify(compiled.model, contract, data)
    model = watch.forecasters.at(result.step / spec_train.steps)
    forecasts = {}
    for clause in contract:
        traj = watch.trajectory(clause, history)
        forecasts[clause.index] = None if traj is None else model.forecast(traj)
    return _rows(before, after, forecasts)


def _rows(before: ContractResult, after: ContractResult,
          forecasts: dict[int, ClauseForecast | None]) -> list[PilotRow]:
    rows = []
    for b, a in zip(before.results, after.results, strict=True):
        kind = a.clause.entry
        rows.append(PilotRow(a.clause.index, a.clause.label, b.measured, a.measured,
                             kind.violation(b) - kind.violation(a), a.passed,
                             kind.guards_task(a.clause), forecasts.get(a.clause.index)))
    return rows
