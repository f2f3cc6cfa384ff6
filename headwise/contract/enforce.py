"""Contract enforcement as constrained training: a lever per clause, Lagrange multipliers.

Each clause is a constraint with a *measured* violation (non-differentiable, verified on the
held-out data at evaluation points) and a differentiable *surrogate*, its lever's loss, trained
on training data drawn like the clause's data (never the verification examples). Following the
proxy-Lagrangian of Cotter et al. (2019), the model minimises the task loss plus
``sum_c lambda_c * surrogate_c`` while each multiplier follows projected dual ascent on the
measured violation::

    lambda_c <- clip(lambda_c + eta * v_c, 0, lambda_max)    at every evaluation point

(the default ``EnforceConfig.dual``, ``ProjectedAscent``; another ``DualUpdate`` may be set by
code; a clause whose lever measures it on every training batch also steps after every training
step, in its own units, and at evaluation points at its own rate: ``headwise.contract.between``)
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

``plan`` returns a ``Plan``: each clause's lever and the objectives the levers add, which the
caller trains with (``train(..., objectives=compiled.objectives + plan.objectives)``).

Each kind builds its own lever (``ClauseKind.lever``; the table is in docs/contracts.md). A
lever's weight is ``lambda * scale`` (an ablation probability is capped at ``p_max``; a loss
term's weight is ``max(0, lambda - loss_from)``). The settings are an ``EnforceConfig``. The
multipliers and the whole history are an ``EnforcementRecord`` (``headwise.contract.record``),
carried as JSON in ``TrainState.extra["enforce"]``, so they are saved in checkpoints and
``--resume`` continues exactly.

Everything the enforcer reads is the *enforcement* set; the verdict a run reports is measured
afterwards on the verification set, which enforcement never sees
(``headwise.pipeline.heldout``). With ``stop: end`` (the default) training runs its whole
budget with the constraints kept, and the model kept is the one of the last evaluation point
at which the contract was certified on the enforcement set (every clause's confidence bound
past its threshold at the contract's family-wise level, ``headwise.contract.certify``; until
there is one, the last at which every clause held with its guard, *confident*; until then,
the last at which the contract held; ``headwise.contract.kept``); ``stop: first_hold`` ends
training at the first point at which the contract held.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any

from torch import nn

from headwise.contract import task
from headwise.contract.between import BatchDual, held_multiplier, tracked, weigh_in_units
from headwise.contract.certify import certify
from headwise.contract.clause import Clause, Contract
from headwise.contract.kept import KeptModel
from headwise.contract.lever import (
    ClauseLever,
    DualContext,
    EnforceConfig,
    PlanContext,
    ProbeSampler,
    RunStructure,
)
from headwise.contract.record import (
    ENTRY,
    KEPT_TIERS,
    ClauseTrack,
    EnforcementRecord,
    EvalPoint,
    PointValues,
)
from headwise.contract.results import ClauseResult, ContractResult, VerifyData
from headwise.contract.verify import verify
from headwise.control.objective import Objective
from headwise.training import LR_SCALE, TrainState


@dataclass
class Plan:
    """What ``plan`` builds: each clause's lever by index (``None``: no lever can move it) and
    the objectives the levers add, at weight 0 (train with them: the multipliers weight
    them)."""

    levers: dict[int, ClauseLever | None]
    objectives: list[Objective] = field(default_factory=list)


def plan(model: nn.Module, contract: Contract, structure: RunStructure, *,
         probes: ProbeSampler | None = None, config: EnforceConfig | None = None,
         data: VerifyData | None = None) -> Plan:
    """Each clause's lever and the objectives they add. Call before ``train()``.

    Args:
        model: the model to train (prepared: ``contract.prepare(model)``).
        contract: the contract to plan for.
        structure: what planning reads of the run besides the model (task names, masks,
            fixed gates, the tasks' circuits; ``headwise.pipeline.compile.Compiled.structure``).
        probes: draws examples like a named probe, for score clauses measured ``on`` one
            (needed only when a clause is).
        config: the enforcement settings (default ``EnforceConfig()``).
        data: the enforcement set; with it, clauses the run's structure makes impossible are
            refused first (``check_possible``).

    Raises:
        SpecError: with ``data``, an impossible clause.
    """
    ctx = PlanContext(model, contract, structure, config or EnforceConfig(), probes, data)
    if data is not None:
        _refuse_impossible(ctx, contract)
    levers = {c.index: c.entry.lever(ctx, c) for c in contract}
    for lever in levers.values():  # a lever that acts from the first step (ClauseLever.start)
        if lever is not None and lever.start:
            for obj in lever.objectives:
                obj.weight = lever.start
    batch = [t for c in contract if (t := tracked(c, levers[c.index], ctx.config)) is not None]
    for t in batch:
        t.lever.unit = t.unit
        weigh_in_units(t)
    extra: list[Objective] = [BatchDual(model, batch, ctx.config)] if batch else []
    return Plan(levers, ctx.objectives + extra)


def check_possible(model: nn.Module, contract: Contract, structure: RunStructure,
                   data: VerifyData, config: EnforceConfig | None = None) -> None:
    """Refuse, before any training, a clause that a structural mask or a fixed gate makes
    impossible (``ClauseKind.check_possible``, measured on ``data``, the enforcement set):
    ``SpecError`` naming the clause and the mask or gate. ``plan`` with ``data`` does this
    first; a plain run calls it alone."""
    _refuse_impossible(PlanContext(model, contract, structure, config or EnforceConfig(),
                                   None, data), contract)


def _refuse_impossible(ctx: PlanContext, contract: Contract) -> None:
    for c in contract:
        c.entry.check_possible(ctx, c)


@dataclass
class Enforcer:
    """The ``train()`` callback (see module docstring).

    Args:
        contract: the contract to hold.
        data: what it is verified on.
        levers: from ``plan`` (``Plan.levers``).
        config: the enforcement settings (``eta``, ``lambda_max``, the dual update; the levers'
            scales were fixed by ``plan``).
        call_every: the steps between enforcement points (``EnforceConfig.cadence``; ``train()``
            calls a callback with ``call_every`` at that cadence rather than at its evaluation
            points); ``None``: at evaluation points.
    """

    contract: Contract
    data: VerifyData
    levers: dict[int, ClauseLever | None]
    config: EnforceConfig = field(default_factory=EnforceConfig)
    kept: KeptModel = field(default_factory=KeptModel)
    call_every: int | None = None

    def __call__(self, state: TrainState) -> None:
        record = EnforcementRecord.of(state.extra)
        self.update(record, state, self.measure(state))
        state.extra[ENTRY] = record.to_dict()

    def measure(self, state: TrainState) -> ContractResult:
        """The contract measured on the enforcement set at an evaluation point."""
        return verify(state.model, self.contract, self.data, bounds=False)

    def update(self, record: EnforcementRecord, state: TrainState,
               result: ContractResult) -> None:
        """One evaluation point: the multipliers' step from ``result`` (the contract measured
        on the enforcement set), the levers' weights, the assists, the record, the kept
        model."""
        lambdas = record.multipliers
        violations = {r.clause.index: r.clause.entry.violation(r) for r in result.results}
        aimed = {r.clause.index: r.clause.entry.violation(r, self.config.guard)
                 for r in result.results}
        levered = [r for r in result.results if self.levers.get(r.clause.index) is not None]
        failing = frozenset(r.clause.task for r in result.results
                            if not r.passed and r.clause.entry.guards_task(r.clause))
        floors = frozenset(c.index for c in self.contract if c.entry.guards_task(c))
        # A multiplier that moved on the training batches lives in its lever's weights; its
        # step here is in its clause's units and weighs as the batches since the last point.
        since = state.step - (record.history[-1].step if record.history else 0)
        steps, rates = {}, {}
        for r in levered:
            index, lever = r.clause.index, self.levers[r.clause.index]
            assert lever is not None
            steps[index] = aimed[index]
            if lever.unit is not None:
                lambdas[index] = held_multiplier(lever)
                steps[index] = aimed[index] / lever.unit
                rates[index] = self.config.eta_batch * since
        interval = state.config.eval_every or since or 1  # the unit of per-point settings
        self.config.dual.update(lambdas, steps,
                                DualContext(self.levers, failing, floors, self.config.eta,
                                            self.config.lambda_max, rates,
                                            share=since / interval))
        for r in levered:
            index = r.clause.index
            lever = self.levers[index]
            assert lever is not None
            self._apply(lever, lambdas[index], r, record.chosen, state.step >= interval)
            if not (lever.assists or lever.desaturation):
                continue
            # assists and a desaturation, once on, weigh as the task's loss does now
            assist = self.config.assist_weight * (1.0 + lever.objectives[0].weight)
            if lever.assists:
                if index not in record.assisted and self._stalled(
                        record.history, index, r, state.step, interval):
                    record.assisted[index] = state.step
                on = index in record.assisted and lambdas[index] > 0
                for obj in lever.assists:
                    follows = lever.follows.get(obj.name)
                    pulls = follows is None or follows.pulls(record.chosen)
                    obj.weight = assist if on and pulls else 0.0
            if lever.desaturation:
                on = self._desaturate(record, lever, r, state)
                for obj in lever.desaturation:
                    obj.weight = assist if on else 0.0
        confident = all(v <= 0.0 for v in aimed.values())
        certified = result.passed and self._certified(state, result)
        pace = self._pace(state, record, result, lambdas, aimed, failing)
        state.extra[LR_SCALE] = pace
        point = EvalPoint(state.step, result.passed, confident, certified=certified, pace=pace)
        for r in result.results:
            index = r.clause.index
            lever = self.levers.get(index)
            _track(record.clauses.setdefault(index, _entry(r.clause, lever)), r, state.step)
            point.clauses[index] = PointValues(r.measured, r.stderr, violations[index],
                                               aimed[index], lambdas.get(index), r.passed,
                                               self._saturated(lever, lambdas.get(index)))
        record.history.append(point)
        if result.passed:
            record.held_at = record.held_at or state.step
            if self.config.stop == "first_hold":  # training ends here: the final model
                record.kept_step, state.stop = state.step, True
            elif _tier(point) >= _tier_of(record.kept_as):
                record.kept_as = KEPT_TIERS[_tier(point)]
                self.kept.keep(state.model, state.out_dir, state.rank, record, state.step)

    def _certified(self, state: TrainState, result: ContractResult) -> bool:
        """Whether every clause is certified on the enforcement set at the contract's
        family-wise level (Holm; ``headwise.contract.certify``): measured only where the
        contract holds there, for the kept model."""
        bounded = [dataclasses.replace(r, bound=certify(r, state.model, self.data,
                                                        self.contract.confidence))
                   for r in result.results]
        return ContractResult(bounded, self.contract.confidence).certified

    def restore_kept(self, model: Any, out_dir: Any, record: EnforcementRecord,
                     final_step: int) -> int:
        """Put the kept model back into ``model`` unless it is the final one; returns the
        step whose weights ``model`` now holds (the final step when the contract never held
        on the enforcement set, or when the dual update keeps the final model)."""
        step = record.kept_step
        if step is None or step == final_step or not self.config.dual.keeps_held_model:
            return final_step
        self.kept.restore(model, out_dir, record)
        return int(step)

    def _stalled(self, history: list[EvalPoint], index: int, result: ClauseResult, step: int,
                 interval: int) -> bool:
        """Whether a failing clause has gone ``assist_patience`` evaluation intervals
        (``interval`` steps each) without its violation falling by more than 0.01 below its
        smallest over them (the task has stopped improving)."""
        span = self.config.assist_patience * interval
        past = [p.clauses[index].violation for p in history
                if index in p.clauses and p.step >= step - span]
        if result.passed or not past or history[0].step > step - span:
            return False
        now = result.clause.entry.violation(result)
        return min(past) - now <= 0.01

    def _desaturate(self, record: EnforcementRecord, lever: ClauseLever,
                    result: ClauseResult, state: TrainState) -> bool:
        """Whether a task floor's desaturation is on from this point. It switches on, once in
        a run, at a point where the floor fails, its task has learned nothing from its input
        (``task.task_learned``: the measure's interval does not clear the input-blind
        answers) and some head of the lever is saturated where the task's answers are read
        (its mean normalised entropy there, on the enforcement set's examples, below the
        lever's floor); it switches off for good once the task has learned or the floor holds
        (``EnforcementRecord.desaturated``)."""
        index = result.clause.index
        span = record.desaturated.get(index)
        if span is not None:
            if span[1] is None and (result.passed or task.task_learned(result) is not False):
                span[1] = state.step
            return span[1] is None
        if result.passed or task.task_learned(result) is not False:
            return False
        batch = self.data.batch(result.clause.task or "", result.clause.path)
        if not any(obj.saturated(state.model, batch) for obj in lever.desaturation):
            return False
        record.desaturated[index] = [state.step, None]
        return True

    def _pace(self, state: TrainState, record: EnforcementRecord, result: ContractResult,
              lambdas: dict[int, float], aimed: dict[int, float],
              failing: frozenset[str | None]) -> float:
        """The factor on the learning rate from this point on (``EnforceConfig.pace_max``).

        AdamW moves a parameter by about the learning rate per step however large the loss's
        weight, so a clause failing with its multiplier at ``lambda_max`` (*capped*) can only
        be moved faster by a faster rate. The pace doubles, up to ``pace_max``, while a capped
        clause is *behind*: at the rate its aimed violation fell over the last two intervals
        between points (``_rate``) it would not reach its aim within half the steps left (the
        other half to hold it and be certified), or it is not falling at all. It halves for
        good (``record.pace_ceiling``) where a capped clause's aimed violation rose since the
        previous point by more than twice the standard error of the difference while the pace
        was above 1 (too fast a rate overshoots; a smaller rise is the measurement's noise).
        It halves, down to 1, when the whole contract holds and while a task floor fails
        (``failing``: a task that has not learned is not helped by a faster rate; levers back
        off where they conflict with a failing floor).
        """
        pace = record.history[-1].pace if record.history else 1.0
        if result.passed or failing:
            return max(pace / 2.0, 1.0)
        capped = [r for r in result.results
                  if not r.passed and self.levers.get(r.clause.index) is not None
                  and lambdas.get(r.clause.index, 0.0) >= self.config.lambda_max]
        if not capped:
            return pace
        before = record.history[-1] if record.history else None
        if pace > 1.0 and before is not None and any(
                _rose(before.clauses.get(r.clause.index), aimed[r.clause.index], r.stderr)
                for r in capped):
            record.pace_ceiling = max(pace / 2.0, 1.0)
            return record.pace_ceiling
        left = max(state.config.steps - state.step, 0)
        behind = False
        for r in capped:
            rate = _rate(record.history, r.clause.index, state.step, aimed[r.clause.index])
            behind = behind or rate is None or rate <= 0.0 \
                or aimed[r.clause.index] / rate > left / 2.0
        if not behind:
            return pace
        ceiling = self.config.pace_max if record.pace_ceiling is None else record.pace_ceiling
        return min(2.0 * pace, ceiling)

    def _saturated(self, lever: ClauseLever | None, lam: float | None) -> bool:
        """Whether the lever is at its limit: the multiplier at ``lambda_max`` or the
        ablation probability at its cap."""
        if lever is None or lam is None:
            return False
        capped = lever.cap is not None and max(lam * lever.scale, lever.start) >= lever.cap
        return lam >= self.config.lambda_max or (capped and not lever.loss_terms)

    def _apply(self, lever: ClauseLever, lam: float, result: ClauseResult,
               chosen: dict[int, str], may_choose: bool) -> None:
        """Weigh the lever's objectives by its multiplier. An ``any_of`` clause drives one
        head, the one closest to the role at the first point one evaluation interval into
        the run (``may_choose``): earlier, the heads' scores are too young to choose by, and
        the lever waits at weight 0."""
        weight = lam * lever.scale
        if lever.cap is not None:
            weight = min(weight, lever.cap)
        weight = max(weight, lever.start)
        targets = lever.objectives
        if lever.per_head and result.clause.quantifier == "any_of":
            if result.clause.index not in chosen and not may_choose:
                return
            pick = chosen.setdefault(result.clause.index,
                                     result.decided_by or next(iter(lever.per_head)))
            targets = lever.per_head.get(pick, targets)
        for obj in targets:
            loss_term = any(obj is o for o in lever.loss_terms)
            obj.weight = max(0.0, lam - lever.loss_from) if loss_term else weight




def _rose(before: PointValues | None, now: float, stderr: float | None) -> bool:
    """Whether a clause's aimed violation ``now`` rose past the previous point's by more than
    twice the standard error of the difference (a missing error counts as 0)."""
    if before is None:
        return False
    spread = math.hypot(stderr or 0.0, before.stderr or 0.0)
    return now - before.aimed > 2.0 * spread


def _rate(history: list[EvalPoint], index: int, step: int, now: float) -> float | None:
    """How fast a clause's aimed violation fell per step, from the point two before this one
    (one, early in a run) to ``now`` at ``step``; ``None`` without an earlier point."""
    earlier = [p for p in history[-2:] if index in p.clauses and p.step < step]
    if not earlier:
        return None
    first = earlier[0]
    return (first.clauses[index].aimed - now) / (step - first.step)


def _tier(point: EvalPoint) -> int:
    """A held point's tier: 2 certified, 1 every clause past its guard, 0 held."""
    return 2 if point.certified else 1 if point.confident else 0


def _tier_of(kept_as: str | None) -> int:
    return KEPT_TIERS.index(kept_as) if kept_as in KEPT_TIERS else 0


def _track(entry: ClauseTrack, result: ClauseResult, step: int) -> None:
    """Update a clause's track: the step from which it holds, its failures, its best value."""
    passed = result.passed
    entry.held_at = (entry.held_at or step) if passed else None
    if not passed:
        entry.failed_evals += 1
        entry.first_failed_at = entry.first_failed_at or step
    value, violation = result.measured, result.clause.entry.violation(result)
    if value is not None and (entry.best is None or violation < entry.best["violation"]):
        entry.best = {"step": step, "violation": violation, "value": value}


def _entry(clause: Clause, lever: ClauseLever | None) -> ClauseTrack:
    return ClauseTrack(clause.index, clause.label,
                       None if lever is None else lever.description,
                       [] if lever is None else [o.name for o in lever.objectives],
                       [] if lever is None else [o.name for o in lever.assists])


def summary(record: EnforcementRecord, final: ContractResult, steps_done: int,
            kept_step: int | None = None) -> dict[str, Any]:
    """What enforcement did, for ``enforcement.json`` and the report.

    ``final`` is the verdict on the verification set. Per clause: its lever, its final
    multiplier, when it first failed, the step from which it held on the enforcement set
    (``None``: it fails there at the end), whether it holds on the verification set, and for a
    clause that does not: its best value on the enforcement set and where, whether its lever
    saturated, and what would help. ``history``: every evaluation point's measured value,
    violation and multiplier per clause (enforcement set). ``kept_step``: the step whose
    weights the run kept (the last evaluation point certified on the enforcement set, else the
    last past every clause's guard, else the last at which the contract held there; the final
    step when it never held) and ``kept_as``, which of the three it was; ``enforcement_set``:
    the verdict, whether it was confident and certified, and the values measured there at
    that step, beside the verification set's ``final``;
    ``assists_from``: per floor whose circuit assists switched on, the step they did;
    ``desaturated``: per floor whose desaturation switched on, the steps it was on from and
    to (``None``: to the end);
    ``pace``: each evaluation point after which the factor on the learning rate changed, and
    the factor (``EnforceConfig.pace_max``; empty: the schedule's rate throughout);
    ``enforced``: whether some lever was weighted at some evaluation point (multipliers
    relax to 0 once their clauses hold with margin, so the final ones do not say).
    """
    holds = {r.clause.index: r.passed for r in final.results}
    unlearned = task.did_not_learn(final.results)
    task_of = {r.clause.index: r.clause.task for r in final.results}
    history = record.history
    at = next((p for p in reversed(history) if p.step == kept_step), None)
    clauses = []
    for index, track in sorted(record.clauses.items()):
        best = track.best or {}
        item = {k: v for k, v in track.to_dict().items() if k != "best"}
        item.update(multiplier=record.multipliers.get(index),
                    holds_at_end=holds.get(track.index))
        if not holds.get(track.index, True):
            last = history[-1].clauses.get(index) if history else None
            saturated = last is not None and last.saturated
            item.update(best_value=best.get("value"), best_step=best.get("step"),
                        saturated=saturated,
                        advice=unlearned.get(task_of.get(index) or "")
                        or _advice(track, saturated, at, index,
                                   record.assisted.get(index)))
        clauses.append(item)
    acted = any(c.multiplier for p in history  # a lever weighted at some point
                for c in p.clauses.values())
    enforcement_set = None if at is None else {
        "step": at.step, "passed": at.passed, "confident": at.confident,
        "certified": at.certified,
        "measured": {str(i): c.measured for i, c in at.clauses.items()}}
    paced, pace = [], 1.0
    for p in history:  # where the factor on the learning rate changed
        if p.pace != pace:
            paced.append({"step": p.step, "pace": p.pace})
            pace = p.pace
    return {"enforced": acted, "evaluations": len(history), "pace": paced,
            "held_at_step": record.held_at, "kept_step": kept_step,
            "kept_as": record.kept_as if at is not None and at.passed else None,
            "steps": steps_done, "contract_holds": final.passed,
            "enforcement_set": enforcement_set,
            "assists_from": {str(i): s for i, s in record.assisted.items()},
            "desaturated": {str(i): {"from": span[0], "to": span[1]}
                            for i, span in record.desaturated.items()},
            "clauses": clauses, "history": [p.to_dict() for p in history]}


def _advice(track: ClauseTrack, saturated: bool, kept: EvalPoint | None,
            index: int, assisted: int | None) -> str:
    """What would help a clause that fails on the verification set, in words: where the kept
    model held it on the enforcement set, the two sets disagree; else its lever's state says.
    (A clause that held only at an earlier point, before the task was learned for one, is no
    disagreement between the sets.) A clause whose circuit assists switched on (at step
    ``assisted``: it had stalled) waited on a circuit in which one head reads another's
    output, which forms sooner at a lower learning rate (docs/contracts.md, "Circuit
    assists"). A clause on a task that learned nothing from its input is told so instead
    (``task.did_not_learn``)."""
    if track.lever is None:
        return ("no lever moves it: change the spec (a structural mask, a gate or an "
                "objective on the head), or drop the clause")
    if kept is not None and index in kept.clauses and kept.clauses[index].passed:
        return ("it held on the enforcement set but not on the verification set: raise "
                "enforce.confidence, or hold out more data (data.eval_examples, a corpus "
                "task's eval_fraction) so both sets measure it closer")
    if assisted is not None:
        return (f"it stalled and its task's circuit was assisted from step {assisted}: a "
                "circuit whose head reads another head's output forms sooner at a lower "
                "train.lr (each of enforce.retries more attempts halves it), or give it "
                "more steps (--enforce-budget)")
    if saturated:
        return ("its lever saturated: a structural lever (a mask or a gate on the head), a "
                "larger budget, or a larger enforce.lambda_max / p_max / pace_max")
    return ("its multiplier was still rising: a larger budget (train.steps, "
            "--enforce-budget), or `headwise plan --pilot N` to see whether it moves")
