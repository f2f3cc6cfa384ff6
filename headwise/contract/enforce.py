"""Contract enforcement as constrained training: a lever per clause, Lagrange multipliers.

Each clause is a constraint with a *measured* violation (non-differentiable, verified on the
held-out data at evaluation points) and a differentiable *surrogate*, its lever's loss, trained
on training data drawn like the clause's data (never the verification examples). Following the
proxy-Lagrangian of Cotter et al. (2019), the model minimises the task loss plus
``sum_c lambda_c * surrogate_c`` while each multiplier follows projected dual ascent on the
measured violation::

    lambda_c <- clip(lambda_c + eta * v_c, 0, lambda_max)    at every evaluation point

with ``v_c`` the signed violation aimed past the bound by ``EnforceConfig.guard`` standard
errors of the clause's measurement (``ClauseKind.violation``: negative when the clause holds
with that margin, so a multiplier relaxes only once a clause holds by more than its
measurement's noise: a clause held by a hair on the enforcement set fails on fresh data about
half the time). Task clauses are constraints too and
are never traded away: while one fails, its own lever (the task's loss weight) rises with its
multiplier, and the multiplier of each lever that degrades that task (an ablation lever on its
examples) is halved before its step; the other levers keep theirs (halving every lever while
a floor failed switched off the very levers that build a task's circuit; docs/benchmarks.md
compares the rules).

Each kind builds its own lever (``ClauseKind.lever``; the table is in docs/contracts.md). A
lever's weight is ``lambda * scale`` (an ablation probability is capped at ``p_max``; a loss
term's weight is ``max(0, lambda - loss_from)``). The settings are an ``EnforceConfig``. The
multipliers and the whole history live in ``TrainState.extra["enforce"]``, so they are saved in
checkpoints and ``--resume`` continues exactly.

Everything the enforcer reads is the *enforcement* set; the verdict a run reports is measured
afterwards on the verification set, which enforcement never sees
(``headwise.pipeline.heldout``). With ``stop: end`` (the default) training runs its whole
budget with the constraints kept, and the model kept is the one of the last evaluation point
at which every clause held with its guard (*confident*; until there is one, the last at which
the contract held; ``headwise.contract.kept``); ``stop: first_hold`` ends training at the
first point at which the contract held.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from headwise.contract.clause import Clause, Contract
from headwise.contract.kept import KeptModel
from headwise.contract.kinds import KINDS
from headwise.contract.lever import ClauseLever, Compiled, EnforceConfig, PlanContext, ProbeSampler
from headwise.contract.results import ClauseResult, ContractResult, VerifyData
from headwise.contract.verify import verify
from headwise.training import TrainState


def plan(compiled: Compiled, contract: Contract, probes: ProbeSampler | None = None,
         config: EnforceConfig | None = None,
         data: VerifyData | None = None) -> dict[int, ClauseLever | None]:
    """Each clause's lever (``None``: no lever can move it), adding the lever objectives to
    ``compiled.objectives`` at weight 0. Call before ``train()``.

    Args:
        compiled: the compiled spec (its model, objectives, task names).
        contract: the contract to plan for.
        probes: draws examples like a named probe, for score clauses measured ``on`` one
            (needed only when a clause is).
        config: the enforcement settings (default ``EnforceConfig()``).
        data: the enforcement set; with it, clauses the run's structure makes impossible are
            refused first (``check_possible``).

    Raises:
        SpecError: with ``data``, an impossible clause.
    """
    ctx = _context(compiled, contract, config, probes, data)
    if data is not None:
        _refuse_impossible(ctx, contract)
    return {c.index: KINDS[c.kind].lever(ctx, c) for c in contract}


def check_possible(compiled: Compiled, contract: Contract, data: VerifyData,
                   config: EnforceConfig | None = None) -> None:
    """Refuse, before any training, a clause that a structural mask or a fixed gate makes
    impossible (``ClauseKind.check_possible``, measured on ``data``, the enforcement set):
    ``SpecError`` naming the clause and the mask or gate. ``plan`` with ``data`` does this
    first; a plain run calls it alone."""
    _refuse_impossible(_context(compiled, contract, config, None, data), contract)


def _context(compiled: Compiled, contract: Contract, config: EnforceConfig | None,
             probes: ProbeSampler | None, data: VerifyData | None) -> PlanContext:
    return PlanContext(compiled, contract.n_layers, contract.n_heads, config or EnforceConfig(),
                       probes, data, {h for c in contract for h in c.heads})


def _refuse_impossible(ctx: PlanContext, contract: Contract) -> None:
    for c in contract:
        KINDS[c.kind].check_possible(ctx, c)


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
    kept: KeptModel = field(default_factory=KeptModel)

    def __call__(self, state: TrainState) -> None:
        record = state.extra.setdefault("enforce", {"history": [], "multipliers": {},
                                                    "chosen": {}, "clauses": {}})
        result = self.measure(state)
        lambdas = record["multipliers"]
        violations = {str(r.clause.index): KINDS[r.clause.kind].violation(r)
                      for r in result.results}
        aimed = {str(r.clause.index): KINDS[r.clause.kind].violation(r, self.config.guard)
                 for r in result.results}
        levered = [r for r in result.results if self.levers.get(r.clause.index) is not None]
        failing = {r.clause.task for r in result.results
                   if not r.passed and KINDS[r.clause.kind].guards_task(r.clause)}
        self.back_off(lambdas, failing)
        self.dual_step(lambdas, {str(r.clause.index): aimed[str(r.clause.index)]
                                 for r in levered})
        assisted = record.setdefault("assisted", {})
        for r in levered:
            key = str(r.clause.index)
            lever = self.levers[r.clause.index]
            assert lever is not None
            self._apply(lever, lambdas[key], r, record["chosen"], key)
            if lever.assists:
                if key not in assisted and self._stalled(record["history"], key, r):
                    assisted[key] = state.step
                on = key in assisted and lambdas[key] > 0
                share = 1.0 + lever.objectives[0].weight  # the task loss's weight now
                for obj in lever.assists:
                    obj.weight = self.config.assist_weight * share if on else 0.0
        confident = all(v <= 0.0 for v in aimed.values())
        point: dict[str, Any] = {"step": state.step, "passed": result.passed,
                                 "confident": confident, "clauses": {}}
        for r in result.results:
            key = str(r.clause.index)
            lever = self.levers.get(r.clause.index)
            _track(record["clauses"].setdefault(key, _entry(r.clause, lever)), r, state.step)
            point["clauses"][key] = {"measured": r.measured, "stderr": r.stderr,
                                     "violation": violations[key], "aimed": aimed[key],
                                     "multiplier": lambdas.get(key), "passed": r.passed,
                                     "saturated": self._saturated(lever, lambdas.get(key))}
        record["history"].append(point)
        if result.passed:
            record["held_at"] = record.get("held_at") or state.step
            if self.config.stop == "first_hold":  # training ends here: the final model
                record["kept_step"], state.stop = state.step, True
            elif confident or not record.get("kept_confident"):
                record["kept_confident"] = confident
                self.kept.keep(state.model, state.out_dir, state.rank, record, state.step)

    def measure(self, state: TrainState) -> ContractResult:
        """The contract measured on the enforcement set at an evaluation point (a subclass
        may time or log it)."""
        return verify(state.model, self.contract, self.data)

    def back_off(self, lambdas: dict[str, float], failing: set[str | None]) -> None:
        """Halve, in place, the multiplier of each lever that degrades a task whose floor
        fails (``ClauseLever.perturbs``: an ablation lever on that task's examples); every
        other lever, a role objective building the task's circuit among them, keeps its
        multiplier."""
        for index, lever in self.levers.items():
            key = str(index)
            if lever is not None and key in lambdas and lever.perturbs & failing:
                lambdas[key] *= 0.5

    def dual_step(self, lambdas: dict[str, float], violations: dict[str, float]) -> None:
        """Projected dual ascent, in place: ``lambdas[k] <- clip(lambda_k + eta v_k, 0, max)``
        for each levered clause ``k``."""
        for key, v in violations.items():
            lam = float(lambdas.get(key, 0.0))
            lambdas[key] = min(max(lam + self.config.eta * v, 0.0), self.config.lambda_max)

    def restore_kept(self, model: Any, out_dir: Any, extra: dict[str, Any],
                     final_step: int) -> int:
        """Put the kept model back into ``model`` unless it is the final one; returns the
        step whose weights ``model`` now holds (the final step when the contract never held
        on the enforcement set: nothing was kept)."""
        record = extra.get("enforce", {})
        step = record.get("kept_step")
        if step is None or step == final_step:
            return final_step
        self.kept.restore(model, out_dir, record)
        return int(step)

    def _stalled(self, history: list[dict[str, Any]], key: str, result: ClauseResult) -> bool:
        """Whether a failing clause has gone ``assist_patience`` evaluation points without its
        violation falling by more than 0.01 (the task has stopped improving)."""
        n = self.config.assist_patience
        past = [p["clauses"][key]["violation"] for p in history[-n:] if key in p["clauses"]]
        if result.passed or len(past) < n:
            return False
        now = KINDS[result.clause.kind].violation(result)
        return min(past) - now <= 0.01

    def _saturated(self, lever: ClauseLever | None, lam: float | None) -> bool:
        """Whether the lever is at its limit: the multiplier at ``lambda_max`` or the
        ablation probability at its cap."""
        if lever is None or lam is None:
            return False
        capped = lever.cap is not None and lam * lever.scale >= lever.cap
        return lam >= self.config.lambda_max or (capped and not lever.loss_terms)

    def _apply(self, lever: ClauseLever, lam: float, result: ClauseResult,
               chosen: dict[str, str], key: str) -> None:
        weight = lam * lever.scale
        if lever.cap is not None:
            weight = min(weight, lever.cap)
        targets = lever.objectives
        if lever.per_head and result.clause.quantifier == "any_of":
            pick = chosen.setdefault(key, result.decided_by or next(iter(lever.per_head)))
            targets = lever.per_head.get(pick, targets)
        for obj in targets:
            loss_term = any(obj is o for o in lever.loss_terms)
            obj.weight = max(0.0, lam - lever.loss_from) if loss_term else weight


def _track(entry: dict[str, Any], result: ClauseResult, step: int) -> None:
    """Update a clause's entry: the step from which it holds, its failures, its best value."""
    passed = result.passed
    entry["held_at"] = (entry["held_at"] or step) if passed else None
    if not passed:
        entry["failed_evals"] += 1
        entry["first_failed_at"] = entry["first_failed_at"] or step
    value, violation = result.measured, KINDS[result.clause.kind].violation(result)
    best = entry.get("best")
    if value is not None and (best is None or violation < best["violation"]):
        entry["best"] = {"step": step, "violation": violation, "value": value}


def _entry(clause: Clause, lever: ClauseLever | None) -> dict[str, Any]:
    return {"index": clause.index, "description": clause.label,
            "lever": None if lever is None else lever.description,
            "lever_objectives": [] if lever is None else [o.name for o in lever.objectives],
            "assists": [] if lever is None else [o.name for o in lever.assists],
            "first_failed_at": None, "failed_evals": 0, "held_at": None, "best": None}


def summary(extra: dict[str, Any], final: ContractResult, steps_done: int,
            kept_step: int | None = None) -> dict[str, Any]:
    """What enforcement did, for ``enforcement.json`` and the report.

    ``final`` is the verdict on the verification set. Per clause: its lever, its final
    multiplier, when it first failed, the step from which it held on the enforcement set
    (``None``: it fails there at the end), whether it holds on the verification set, and for a
    clause that does not: its best value on the enforcement set and where, whether its lever
    saturated, and what would help. ``history``: every evaluation point's measured value,
    violation and multiplier per clause (enforcement set). ``kept_step``: the step whose
    weights the run kept (the last evaluation point at which the contract held on the
    enforcement set, with every clause's guard where some point had it; the final step when it
    never held); ``enforcement_set``: the verdict, whether it was confident, and the values
    measured there at that step, beside the verification set's ``final``;
    ``assists_from``: per floor whose circuit assists switched on, the step they did;
    ``enforced``: whether some lever was weighted at some evaluation point (multipliers
    relax to 0 once their clauses hold with margin, so the final ones do not say).
    """
    record = extra.get("enforce", {"history": [], "multipliers": {}, "clauses": {}})
    holds = {r.clause.index: r.passed for r in final.results}
    history = record["history"]
    clauses = []
    for key, entry in sorted(record["clauses"].items(), key=lambda kv: int(kv[0])):
        best = entry.get("best") or {}
        item = {k: v for k, v in entry.items() if k != "best"}
        item.update(multiplier=record["multipliers"].get(key),
                    holds_at_end=holds.get(entry["index"]))
        if not holds.get(entry["index"], True):
            saturated = bool(history) and bool(history[-1]["clauses"].get(key, {})
                                               .get("saturated"))
            item.update(best_value=best.get("value"), best_step=best.get("step"),
                        saturated=saturated,
                        advice=_advice(entry, saturated, history, key))
        clauses.append(item)
    acted = any(c.get("multiplier") for p in history  # a lever weighted at some point
                for c in p["clauses"].values())
    at = next((p for p in reversed(history) if p["step"] == kept_step), None)
    enforcement_set = None if at is None else {
        "step": at["step"], "passed": at["passed"], "confident": at.get("confident"),
        "measured": {k: c["measured"] for k, c in at["clauses"].items()}}
    return {"enforced": acted, "evaluations": len(history),
            "held_at_step": record.get("held_at"), "kept_step": kept_step,
            "steps": steps_done, "contract_holds": final.passed,
            "enforcement_set": enforcement_set, "assists_from": dict(record.get("assisted", {})),
            "clauses": clauses, "history": history}


def _advice(entry: dict[str, Any], saturated: bool, history: list[dict[str, Any]],
            key: str) -> str:
    """What would help a clause that fails at the end, in words."""
    if entry["lever"] is None:
        return ("no lever moves it: change the spec (a structural mask, a gate or an "
                "objective on the head), or drop the clause")
    held = any(p["clauses"].get(key, {}).get("passed") for p in history)
    if held:
        return ("it held on the enforcement set but not on the verification set: raise "
                "enforce.confidence, or hold out more data (data.eval_examples, a corpus "
                "task's eval_fraction) so both sets measure it closer")
    if saturated:
        return ("its lever saturated: a structural lever (a mask or a gate on the head) "
                "or a larger enforce.lambda_max / p_max")
    return ("its multiplier was still rising: a larger budget (train.steps, "
            "--enforce-budget), or `headwise plan --pilot N` to see whether it moves")
