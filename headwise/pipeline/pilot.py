"""A pilot: a few plain training steps, to see which clauses and floors move before a long run.

``pilot(compiled, contract, steps)`` measures the contract on the enforcement set, trains the
compiled model ``steps`` plain steps in memory (no run directory, no levers driven), and
measures again: per clause its value before and after and the signed change towards its bound.
A clause that does not move in a pilot where its task learns needs a lever (``--enforce``) or
a structural one (a mask, a gate); a floor that does not move is a task that is not learning.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from headwise.contract import Contract, ContractResult, verify
from headwise.contract.kinds import KINDS
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


def pilot(compiled: Compiled, contract: Contract, steps: int) -> list[PilotRow]:
    """Train ``compiled.model`` ``steps`` plain steps (its spec's settings, no evaluation
    points) and report each clause's movement on the enforcement set.

    Raises:
        SpecError: ``steps`` is not a valid number of steps.
    """
    from headwise.pipeline.run import check_steps

    config = dataclasses.replace(compiled.spec.train, steps=check_steps(steps),
                                 warmup_steps=min(compiled.spec.train.warmup_steps, steps),
                                 eval_every=0, checkpoint_every=0)
    data = enforcement_data(compiled)
    before = verify(compiled.model, contract, data)
    train(compiled.model, compiled.data, config, objectives=compiled.objectives,
          optimizer_hooks=compiled.optimizer_hooks, progress=False)
    after = verify(compiled.model, contract, data)
    return _rows(before, after)


def _rows(before: ContractResult, after: ContractResult) -> list[PilotRow]:
    rows = []
    for b, a in zip(before.results, after.results, strict=True):
        kind = KINDS[a.clause.kind]
        rows.append(PilotRow(a.clause.index, a.clause.label, b.measured, a.measured,
                             kind.violation(b) - kind.violation(a), a.passed,
                             kind.guards_task(a.clause)))
    return rows
