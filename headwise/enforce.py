"""Contract enforcement as constrained training: a lever per clause, Lagrange multipliers.

Each clause is a constraint with a *measured* violation (non-differentiable, verified on the
held-out data at evaluation points) and a differentiable *surrogate*, its lever's loss, trained
on training data drawn like the clause's data (never the verification examples). Following the
proxy-Lagrangian of Cotter et al. (2019), the model minimises the task loss plus
``sum_c lambda_c * surrogate_c`` while each multiplier follows projected dual ascent on the
measured violation::

    lambda_c <- clip(lambda_c + eta * v_c, 0, lambda_max)    at every evaluation point

with ``v_c`` the signed violation (``bound - measured`` for a lower bound, ``measured - bound``
for an upper bound; negative when the clause holds, so a multiplier relaxes once its clause
holds with margin). Task floors are constraints too and are never traded away: while one fails,
every other multiplier is halved (the other levers back off) and the floor's own lever (the
task's loss weight) rises.

Levers by clause kind (``plan``):

==========================  ====================================================================
score ``at_least``          the role's pattern objective (``headwise.patterns``) on the clause's
                            head(s); ``any_of``: only on the head closest to the role at the
                            first evaluation point; ``entropy``: a ``RoleBound`` lower bound
score ``at_most``           ``RoleBound``: a penalty on the role's per-row score above the bound
ablation ``drop_at_least``  ``StochasticAblation`` of the *other* heads of the set's layers on
                            the task's examples (the set becomes sufficient), then, once that
                            probability is at ``P_MAX``, ``AblatedMargin``: a hinge on the
                            set-ablated model's logits (the task needs the set); see
                            ``DROP_LEVER`` and docs/contracts.md
ablation ``drop_at_most``   ``StochasticAblation`` of the set on the task's examples
exclusive                   both: the ``drop_at_least`` lever on the listed tasks, the set
                            ablated on the rest
task ``at_least`` (floor)   ``TaskLossWeight``: extra weight on the task's loss (``loss``
                            metric: ``at_most``)
==========================  ====================================================================

A lever's weight is ``lambda * scale`` (an ablation probability is capped at ``P_MAX``; the
hinge's weight is ``max(0, lambda - P_MAX / ABLATION_SCALE)``). ``Enforcer.dual_step`` is the
multiplier update (``bench/cooper_duals.py`` swaps in ``cooper-optim``'s, for comparison). The
multipliers and the whole history live in ``TrainState.extra["enforce"]``, so they are saved in
checkpoints and ``--resume`` continues exactly. Training stops at the first evaluation point
where the whole contract holds.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from headwise.analysis.contract import Clause, Contract
from headwise.analysis.verify import ClauseResult, ContractResult, VerifyData, verify
from headwise.control.objectives import PatternObjective, RoleBound
from headwise.control.task_levers import (
    AblatedMargin,
    Interchange,
    OnProbeData,
    StochasticAblation,
    TaskLossWeight,
)
from headwise.data import Batch
from headwise.heads import Head, HeadSet
from headwise.patterns import ROLE_NAMES, TARGET_ROLES
from headwise.training import TrainState

ProbeSampler = Callable[[str, int, int], Batch]
"""``fn(probe name, n, seed) -> Batch``: ``n`` examples drawn like a named probe (the
pipeline passes ``headwise.pipeline.run.probe_sampler(spec)``)."""


class Compiled(Protocol):
    """What ``plan`` reads of a compiled spec (``headwise.pipeline.compile.Compiled``)."""

    spec: Any
    model: Any
    objectives: list[Any]

    @property
    def task_names(self) -> tuple[str, ...]: ...

# Role scores whose lever is another role's (TransformerLens variants measure the same role).
ROLE_OF_SCORE = {**{r: r for r in ROLE_NAMES}, "previous_token_tl": "previous_token",
                 "induction_tl": "induction", "duplicate_token_tl": "duplicate_token"}
ETA = 4.0  # dual step per unit of violation
LAMBDA_MAX = 16.0
P_MAX = 0.5  # highest stochastic-ablation probability
ABLATION_SCALE = 0.15  # ablation probability per unit of multiplier
MARGIN = 0.05  # bounds levers aim past, so held-out data holds too
# The lever of "H carries T" (``drop_at_least``), chosen by measurement (docs/benchmarks.md):
# "others>margin": the other heads of H's layers stochastically ablated (H sufficient), then,
# once that probability has reached P_MAX, the ablated-H hinge (H necessary) weighted by the
# multiplier's excess; "others+margin" both from the start; "others", "margin" or "iit"
# (interchange intervention) alone.
DROP_LEVER = "others>margin"
DROP_LEVERS = ("others", "margin", "others+margin", "others>margin", "iit")


@dataclass
class Lever:
    """A clause's lever: ``objectives`` whose weight is ``multiplier * scale`` (at most ``cap``).

    ``per_head`` (``any_of`` score clauses) maps each head to its own objective; only the head
    chosen at the first evaluation point is driven. ``loss_weighted``: objectives among
    ``objectives`` that are loss terms in an ablation lever (whose ``scale``/``cap`` turn the
    multiplier into a probability): their weight is ``max(0, multiplier - loss_from)``.
    """

    kind: str
    description: str
    objectives: list[Any] = field(default_factory=list)
    scale: float = 1.0
    cap: float | None = None
    per_head: dict[str, Any] = field(default_factory=dict)
    loss_weighted: list[Any] = field(default_factory=list)
    loss_from: float = 0.0


def _masked(compiled: Compiled) -> set[Head]:
    return {h for r in compiled.spec.heads if r.mask is not None for h in r.heads}


def _add(compiled: Compiled, obj: Any, name: str) -> Any:
    obj.name = name  # unique: checkpoints store lever weights by name
    obj.weight = 0.0
    compiled.objectives.append(obj)
    return obj


def _others(clause: Clause, n_heads: int) -> list[Head]:
    """Heads of the clause's layers that are not the clause's."""
    mine = set(clause.heads)
    return [Head(l, h) for l in sorted({x.layer for x in mine}) for h in range(n_heads)
            if Head(l, h) not in mine]


def _score_lever(compiled: Compiled, clause: Clause, hs: Any,
                 probes: ProbeSampler | None) -> Lever | None:
    role = ROLE_OF_SCORE.get(clause.score or "")
    heads = [h for h in clause.heads if h not in _masked(compiled)]
    if not heads:  # a structural mask fixes every head's pattern: nothing to drive
        return Lever("structural", f"structural mask on {_names(clause.heads)} (fixed)")
    if role is None:
        return None
    tag = f"[{clause.path}]"
    on = _probe_sampler(compiled, clause, probes)
    where = f" on {clause.on}-like batches" if on is not None else ""
    if clause.at_least is not None and role in TARGET_ROLES:
        lever = Lever("pattern", f"pattern objective ({role}, ce) on {_names(heads)}{where}")
        for h in heads:
            name = f"enforce:{role}[{h}]{tag}"
            obj = _add(compiled, _on(compiled, PatternObjective(
                compiled.model, hs(h), role, kind="ce"), name, on), name)
            lever.per_head[str(h)] = obj
            lever.objectives.append(obj)
        return lever
    lo = None if clause.at_least is None else min(1.0, clause.at_least + MARGIN)
    hi = None if clause.at_most is None else max(0.0, clause.at_most - MARGIN)
    name = f"enforce:bound:{role}[{_names(heads)}]{tag}"
    obj = _add(compiled, _on(compiled, RoleBound(compiled.model, hs(heads), role, min=lo,
                                                 max=hi), name, on), name)
    bounds = " and ".join(x for x in (lo is not None and f">= {lo:g}" or "",
                                      hi is not None and f"<= {hi:g}" or "") if x)
    return Lever("bound", f"row-wise {role} bound {bounds} on {_names(heads)}{where}", [obj])


def _probe_sampler(compiled: Compiled, clause: Clause,
                   probes: ProbeSampler | None) -> Callable[[int, int], Batch] | None:
    """Draws examples like the clause's probe (``None``: the clause is measured on held-out
    task data, so the training batches are already drawn like it).

    Raises:
        ValueError: the clause is measured on a probe and no ``probes`` sampler was given.
    """
    if clause.on is None or clause.on == "default" or clause.on in compiled.task_names:
        return None
    if probes is None:
        raise ValueError(f"plan: {clause.path} is measured on probe {clause.on!r}; pass "
                         "probes= (headwise.pipeline.run.probe_sampler)")
    on = clause.on
    return lambda n, seed: probes(on, n, seed)


def _on(compiled: Compiled, lever: Any, name: str,
        sample: Callable[[int, int], Batch] | None) -> Any:
    lever.name = name
    return lever if sample is None else OnProbeData(compiled.model, lever, sample)


def _carry_parts(clause: Clause, ids: list[int], n_heads: int,
                 drop_lever: str) -> list[tuple[str, list[Head], list[int]]]:
    """The parts of a ``drop_at_least`` lever: (what, heads, tasks) per ``drop_lever``.

    Raises:
        ValueError: ``drop_lever`` is not one of ``DROP_LEVERS``.
    """
    if drop_lever not in DROP_LEVERS:
        raise ValueError(f"DROP_LEVER: got {drop_lever!r}, expected one of {DROP_LEVERS}")
    others = _others(clause, n_heads)
    parts: list[tuple[str, list[Head], list[int]]] = []
    if "others" in drop_lever and others:
        parts.append(("others", others, ids))
    if "margin" in drop_lever:
        parts.append(("margin", list(clause.heads), ids))
    if drop_lever == "iit":
        parts.append(("iit", list(clause.heads), ids))
    return parts


_LEVER_CLASS = {"others": StochasticAblation, "self": StochasticAblation,
                "margin": AblatedMargin, "iit": Interchange}
_LEVER_WORDS = {"others": "ablate {} on {} examples", "self": "ablate {} on {} examples",
                "margin": "hinge on {}-ablated {} examples", "iit": "interchange {} on {} examples"}


def _ablation_levers(compiled: Compiled, clause: Clause, hs: Any) -> Lever | None:
    names = list(compiled.task_names)
    listed = list(clause.tasks) if clause.kind == "exclusive" else [clause.task or ""]
    ids = [names.index(t) for t in listed]
    parts: list[tuple[str, list[Head], list[int]]] = []
    if clause.at_least is not None:  # the tasks must depend on the clause's heads
        parts += _carry_parts(clause, ids, compiled.spec.n_heads, DROP_LEVER)
    rest = [i for i in range(len(names)) if i not in ids]
    if clause.kind == "exclusive" and rest:  # the other tasks must not need them
        parts.append(("self", list(clause.heads), rest))
    if clause.kind == "ablation" and clause.at_most is not None:
        parts.append(("self", list(clause.heads), ids))
    if not parts:
        return None
    staged = DROP_LEVER == "others>margin" and parts[0][0] == "others"
    lever = Lever("ablation", "; ".join(
        _LEVER_WORDS[what].format(_names(heads), [names[i] for i in tasks])
        for what, heads, tasks in parts), scale=ABLATION_SCALE, cap=P_MAX,
        loss_from=P_MAX / ABLATION_SCALE if staged else 0.0)  # after p saturates
    for what, heads, tasks in parts:
        name = f"enforce:{'ablate-' if what in ('others', 'self') else ''}{what}" \
               f"[{_names(heads)}][{clause.path}]"
        obj = _add(compiled, _LEVER_CLASS[what](compiled.model, hs(heads), tasks), name)
        if what in ("margin", "iit"):
            lever.loss_weighted.append(obj)  # a loss term: weight = multiplier, not a probability
        lever.objectives.append(obj)
    return lever


def _task_lever(compiled: Compiled, clause: Clause) -> Lever | None:
    floor = (clause.at_least is not None if clause.metric != "loss"
             else clause.at_most is not None)
    if not floor or clause.task is None:
        return None
    task_id = list(compiled.task_names).index(clause.task)
    obj = _add(compiled, TaskLossWeight(compiled.model, task_id),
               f"enforce:task-weight[{clause.task}][{clause.path}]")
    return Lever("task_weight", f"extra loss weight on {clause.task}", [obj])


def _names(heads: Any) -> str:
    return ",".join(str(h) for h in heads)


def plan(compiled: Compiled, contract: Contract,
         probes: ProbeSampler | None = None) -> dict[int, Lever | None]:
    """Each clause's lever (``None``: no lever can move it), adding the lever objectives to
    ``compiled.objectives`` at weight 0. Call before ``train()``.

    Args:
        compiled: the compiled spec (its model, objectives, task names).
        contract: the contract to plan for.
        probes: draws examples like a named probe, for score clauses measured ``on`` one
            (needed only when a clause is).
    """
    def hs(heads: Any) -> HeadSet:
        items = [heads] if isinstance(heads, Head) else list(heads)
        return HeadSet(items, contract.n_layers, contract.n_heads)

    out: dict[int, Lever | None] = {}
    for clause in contract:
        if clause.kind == "score":
            out[clause.index] = _score_lever(compiled, clause, hs, probes)
        elif clause.kind in ("ablation", "exclusive"):
            out[clause.index] = _ablation_levers(compiled, clause, hs)
        else:
            out[clause.index] = _task_lever(compiled, clause)
    return out


def measured_on(clause: Clause) -> str:
    """What a clause is measured on, in words (for ``headwise plan``)."""
    if clause.kind == "score":
        return f"probe {clause.on or 'default'}"
    if clause.kind == "exclusive":
        return "every task's held-out examples, the set ablated"
    held = f"held-out {clause.task} examples"
    return held if clause.kind == "task" else f"{held}, ablated ({clause.mode})"


def violation(result: ClauseResult) -> float:
    """Signed violation of a clause (> 0: fails by that much; < 0: holds with that margin)."""
    c = result.clause
    if result.measured is None:
        return 1.0
    if c.kind == "exclusive":
        others = result.details.get("others_max")
        v = (c.at_least or 0.0) - result.measured
        if others is not None and c.at_most is not None:
            v = max(v, others - c.at_most)
        return v
    parts = []
    if c.at_least is not None:
        parts.append(c.at_least - result.measured)
    if c.at_most is not None:
        parts.append(result.measured - c.at_most)
    scale = 1.0 if c.metric != "loss" or c.kind == "score" else max(abs(result.measured), 1.0)
    return max(parts) / scale


@dataclass
class Enforcer:
    """The ``train()`` callback (see module docstring).

    Args:
        contract: the contract to hold.
        data: what it is verified on.
        levers: from ``plan``.
        eta: dual step per unit of violation.
        lambda_max: cap on every multiplier.
    """

    contract: Contract
    data: VerifyData
    levers: dict[int, Lever | None]
    eta: float = ETA
    lambda_max: float = LAMBDA_MAX

    def __call__(self, state: TrainState) -> None:
        record = state.extra.setdefault("enforce", {"history": [], "multipliers": {},
                                                    "chosen": {}, "clauses": {}})
        result = verify(state.model, self.contract, self.data)
        lambdas = record["multipliers"]
        floors_fail = any(not r.passed and r.clause.kind == "task" for r in result.results)
        violations = {str(r.clause.index): violation(r) for r in result.results}
        levered = [r for r in result.results if self.levers.get(r.clause.index) is not None]
        self.dual_step(lambdas, {str(r.clause.index): violations[str(r.clause.index)]
                                 for r in levered},
                       {str(r.clause.index) for r in levered if r.clause.kind == "task"},
                       floors_fail)
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

    def dual_step(self, lambdas: dict[str, float], violations: dict[str, float],
                  floors: set[str], floors_fail: bool) -> None:
        """Projected dual ascent, in place: ``lambdas[k] <- clip(lambda_k + eta v_k, 0, max)``
        for each levered clause ``k``; while a floor fails, the non-floor multipliers are
        halved first (the other levers back off)."""
        for key, v in violations.items():
            lam = float(lambdas.get(key, 0.0))
            if floors_fail and key not in floors:
                lam *= 0.5  # task floors first: the other levers back off
            lambdas[key] = min(max(lam + self.eta * v, 0.0), self.lambda_max)

    def _apply(self, lever: Lever, lam: float, result: ClauseResult,
               chosen: dict[str, str], key: str) -> None:
        weight = lam * lever.scale
        if lever.cap is not None:
            weight = min(weight, lever.cap)
        targets = lever.objectives
        if lever.per_head and result.clause.quantifier == "any_of":
            pick = chosen.setdefault(key, result.decided_by or next(iter(lever.per_head)))
            targets = [lever.per_head[pick]] if pick in lever.per_head else targets
        for obj in targets:
            loss_term = any(obj is o for o in lever.loss_weighted)
            obj.weight = max(0.0, lam - lever.loss_from) if loss_term else weight


def _track(entry: dict[str, Any], passed: bool, step: int) -> None:
    """Update a clause's entry: the step from which it holds, its failures."""
    entry["held_at"] = (entry["held_at"] or step) if passed else None
    if not passed:
        entry["failed_evals"] += 1
        entry["first_failed_at"] = entry["first_failed_at"] or step


def _entry(clause: Clause, lever: Lever | None) -> dict[str, Any]:
    return {"index": clause.index, "description": clause.name or clause.describe(),
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
