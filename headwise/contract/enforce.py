"""Contract enforcement as constrained training: a lever per clause, Lagrange multipliers.

Each clause is a constraint with a *measured* violation (non-differentiable, verified on the
held-out data at evaluation points) and a differentiable *surrogate*, its lever's loss, trained
on training data drawn like the clause's data (never the verification examples). Following the
proxy-Lagrangian of Cotter et al. (2019), the model minimises the task loss plus
``sum_c lambda_c * surrogate_c`` while each multiplier follows projected dual ascent on the
measured violation::

    lambda_c <- clip(lambda_c + eta * v_c, 0, lambda_max)    at every evaluation point

with ``v_c`` the signed violation (``ClauseKind.violation``: negative when the clause holds, so
a multiplier relaxes once its clause holds with margin). Task clauses are constraints too and
are never traded away: while one fails, every other multiplier is halved (the other levers back
off) and the floor's own lever (the task's loss weight) rises.

Each kind builds its own lever (``ClauseKind.lever``; the table is in docs/contracts.md). A
lever's weight is ``lambda * scale`` (an ablation probability is capped at ``p_max``; a loss
term's weight is ``max(0, lambda - loss_from)``). The settings are an ``EnforceConfig``. The
multipliers and the whole history live in ``TrainState.extra["enforce"]``, so they are saved in
checkpoints and ``--resume`` continues exactly. Training stops at the first evaluation point
where the whole contract holds.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from headwise.contract.clause import Clause, Contract
from headwise.contract.kinds import KINDS
from headwise.contract.lever import ClauseLever, Compiled, EnforceConfig, PlanContext, ProbeSampler
from headwise.contract.results import ClauseResult, ContractResult, VerifyData
from headwise.contract.verify import verify
from headwise.training import TrainState


def plan(compiled: Compiled, contract: Contract, probes: ProbeSampler | None = None,
         config: EnforceConfig | None = None) -> dict[int, ClauseLever | None]:
    """Each clause's lever (``None``: no lever can move it), adding the lever objectives to
    ``compiled.objectives`` at weight 0. Call before ``train()``.

    Args:
        compiled: the compiled spec (its model, objectives, task names).
        contract: the contract to plan for.
        probes: draws examples like a named probe, for score clauses measured ``on`` one
            (needed only when a clause is).
        config: the enforcement settings (default ``EnforceConfig()``).
    """
    ctx = PlanContext(compiled, contract.n_layers, contract.n_heads, config or EnforceConfig(),
                      probes)
    return {c.index: KINDS[c.kind].lever(ctx, c) for c in contract}


@dataclass
class Enforcer:
    """The ``train()`` callback (see module docstring).

    Args:
        contract: the contract to hold.
        data: what it is verified on.
        levers: from ``plan``.
        config: the enforcement settings (``eta``, ``lambda_max``; the levers' scales were
            fixed by ``plan``).
    """

    contract: Contract
    data: VerifyData
    levers: dict[int, ClauseLever | None]
    config: EnforceConfig = field(default_factory=EnforceConfig)

    def __call__(self, state: TrainState) -> None:
        record = state.extra.setdefault("enforce", {"history": [], "multipliers": {},
                                                    "chosen": {}, "clauses": {}})
        result = self.measure(state)
        lambdas = record["multipliers"]
        tasks_fail = any(not r.passed and KINDS[r.clause.kind].guards_task(r.clause)
                         for r in result.results)
        violations = {str(r.clause.index): KINDS[r.clause.kind].violation(r)
                      for r in result.results}
        levered = [r for r in result.results if self.levers.get(r.clause.index) is not None]
        self.dual_step(lambdas, {str(r.clause.index): violations[str(r.clause.index)]
                                 for r in levered},
                       {str(r.clause.index) for r in levered
                        if KINDS[r.clause.kind].guards_task(r.clause)}, tasks_fail)
        for r in levered:
            key = str(r.clause.index)
            self._apply(self.levers[r.clause.index], lambdas[key], r,  # type: ignore[arg-type]
                        record["chosen"], key)
        point: dict[str, Any] = {"step": state.step, "passed": result.passed, "clauses": {}}
        for r in result.results:
            key = str(r.clause.index)
            _track(record["clauses"].setdefault(key, _entry(r.clause, self.levers.get(
                r.clause.index))), r.passed, state.step)
            point["clauses"][key] = {"measured": r.measured, "violation": violations[key],
                                     "multiplier": lambdas.get(key), "passed": r.passed}
        record["history"].append(point)
        if result.passed:
            record["held_at"] = state.step
            state.stop = True

    def measure(self, state: TrainState) -> ContractResult:
        """The contract measured at an evaluation point (a subclass may time or log it)."""
        return verify(state.model, self.contract, self.data)

    def dual_step(self, lambdas: dict[str, float], violations: dict[str, float],
                  guards: set[str], tasks_fail: bool) -> None:
        """Projected dual ascent, in place: ``lambdas[k] <- clip(lambda_k + eta v_k, 0, max)``
        for each levered clause ``k``; while a task clause fails, the multipliers of the
        clauses not in ``guards`` are halved first (the other levers back off)."""
        for key, v in violations.items():
            lam = float(lambdas.get(key, 0.0))
            if tasks_fail and key not in guards:
                lam *= 0.5  # task floors first: the other levers back off
            lambdas[key] = min(max(lam + self.config.eta * v, 0.0), self.config.lambda_max)

    def _apply(self, lever: ClauseLever, lam: float, result: ClauseResult,
               chosen: dict[str, str], key: str) -> None:
        weight = lam * lever.scale
        if lever.cap is not None:
            weight = min(weight, lever.cap)
        targets = lever.objectives
        if lever.per_head and result.clause.quantifier == "any_of":
            pick = chosen.setdefault(key, result.decided_by or next(iter(lever.per_head)))
            targets = [lever.per_head[pick]] if pick in lever.per_head else targets
        for obj in targets:
            loss_term = any(obj is o for o in lever.loss_terms)
            obj.weight = max(0.0, lam - lever.loss_from) if loss_term else weight


def _track(entry: dict[str, Any], passed: bool, step: int) -> None:
    """Update a clause's entry: the step from which it holds, its failures."""
    entry["held_at"] = (entry["held_at"] or step) if passed else None
    if not passed:
        entry["failed_evals"] += 1
        entry["first_failed_at"] = entry["first_failed_at"] or step


def _entry(clause: Clause, lever: ClauseLever | None) -> dict[str, Any]:
    return {"index": clause.index, "description": clause.label,
            "lever": None if lever is None else lever.description,
            "lever_objectives": [] if lever is None else [o.name for o in lever.objectives],
            "first_failed_at": None, "failed_evals": 0, "held_at": None}


def summary(extra: dict[str, Any], final: ContractResult, steps_done: int) -> dict[str, Any]:
    """What enforcement did, for ``enforcement.json`` and the report.

    Per clause: its lever, its final multiplier, when it first failed, the step from which it
    held (``None``: it fails at the end), and whether it holds at the end; ``history``: every
    evaluation point's measured value, violation and multiplier per clause.
    """
    record = extra.get("enforce", {"history": [], "multipliers": {}, "clauses": {}})
    holds = {r.clause.index: r.passed for r in final.results}
    clauses = [{**entry, "multiplier": record["multipliers"].get(key),
                "holds_at_end": holds.get(entry["index"])}
               for key, entry in sorted(record["clauses"].items(), key=lambda kv: int(kv[0]))]
    acted = any(v for v in record["multipliers"].values())
    return {"enforced": acted, "evaluations": len(record["history"]),
            "held_at_step": record.get("held_at"), "steps": steps_done,
            "contract_holds": final.passed, "clauses": clauses,
            "history": record["history"]}
