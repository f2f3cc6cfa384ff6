"""Task clauses: the model still does its job (a task floor, or a cap).

``{task: copy, metric: accuracy, at_least: 0.95}``; ``metric`` is ``accuracy`` (token-weighted),
``exact`` (per example) or ``loss`` (nats), measured on the task's held-out batch with a
bootstrap CI (``task_metric_ci``). A lower bound (``at_most`` for loss) is a floor: its lever is
extra weight on the task's loss. When the task has a circuit (declared by its generator,
``headwise.data.Task.circuit``, or proposed from its training examples,
``headwise.data.circuit_proposals``), the lever also holds that circuit's role objectives on
heads the contract leaves to it (*assists*), which the enforcer switches on only when the floor
fails and has stopped improving. Every floor's lever also holds a *desaturation* (an entropy
floor, ``DESATURATION_FLOOR``, on the heads no mask fixes and no score clause shapes), idle
until the floor fails with its task at the input-blind answers and a head saturated where the
answers are read (docs/contracts.md, "A task that learns nothing").
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import torch
from torch import Tensor, nn

from headwise.analysis.importance import task_metric_ci
from headwise.analysis.importance_matrix import ci_stderr
from headwise.contract import fields, path, score
from headwise.contract.certify import examples_if_perfect, task_clause_bound
from headwise.contract.clause import METRICS, UNIT_METRICS, Clause, holds, number_or_none
from headwise.contract.kind import ClauseKind, ParseContext
from headwise.contract.lever import ClauseLever, Follows, LeverKind, PlanContext, names
from headwise.contract.results import Bound, ClauseResult, VerifyData
from headwise.control.objectives import Desaturation, PatternObjective, StandbyPattern
from headwise.control.task_levers import TaskLossWeight
from headwise.data import IGNORE
from headwise.errors import SpecError
from headwise.heads import Head, HeadSet
from headwise.render.numbers import fixed

# The normalised entropy (0 = one key, 1 = uniform) a task floor's desaturation holds the rows
# of its task's examples above while it is on, and below which a head counts as saturated.
# As a whole-run floor 0.1, 0.3 and 0.5 each took modular addition off its seed-2 saddle; 0.3
# lets a row put 90% of its mass on one of five keys (docs/benchmarks.md, "A task that learns
# nothing").
DESATURATION_FLOOR = 0.3


class TaskKind(ClauseKind):
    name = "task"
    keys = frozenset({"task", "metric", "at_least", "at_most", "name"})

    def claims(self, raw: Mapping[str, Any]) -> bool:
        return "task" in raw

    def parse(self, path: str, index: int, raw: dict[str, Any], ctx: ParseContext) -> Clause:
        task = fields.task(path, "task", raw.get("task"), ctx.tasks)
        metric = fields.choice(path, raw, "metric", METRICS, "accuracy")
        lo, hi = fields.number(path, raw, "at_least"), fields.number(path, raw, "at_most")
        if lo is None and hi is None:
            raise SpecError(f"{path}: missing bound; expected 'at_least' and/or 'at_most' (a "
                            f"task floor such as {{task: {task}, metric: accuracy, at_least: "
                            "0.95})")
        fields.ordered(path, "at_least", lo, "at_most", hi)
        low, high = metric_range(metric)
        fields.in_range(path, {"at_least": lo, "at_most": hi}, low, high,
                        f"a number in [{low:g}, {high:g}] (the range of {metric})")
        return Clause(index, self, "model", HeadSet([], ctx.n_layers, ctx.n_heads), task=task,
                      metric=metric, at_least=lo, at_most=hi, name=fields.name(path, raw),
                      source=dict(raw))

    def describe(self, clause: Clause) -> str:
        return f"task {clause.task}: {clause.metric}"

    def value_range(self, clause: Clause) -> tuple[float, float]:
        return metric_range(clause.metric)

    def measured_on(self, clause: Clause) -> str:
        return f"held-out {clause.task} examples"

    def bounded(self, clause: Clause) -> list[tuple[tuple[Any, ...], str]]:
        return [(("task", clause.task, clause.metric), f"{clause.task} {clause.metric}")]

    def measure(self, model: nn.Module, clause: Clause, data: VerifyData) -> ClauseResult:
        batch = data.batch(clause.task or "", clause.path)
        value, low, high = task_metric_ci(model, batch, clause.metric, n_boot=data.n_boot)
        return ClauseResult(clause, holds(value, clause.at_least, clause.at_most),
                            number_or_none(value), clause.threshold_text(), "the model",
                            ci=(low, high),
                            details={"examples": int(batch.tokens.shape[0]),
                                     "input_blind": number_or_none(
                                         input_blind(batch.targets, clause.metric))},
                            stderr=number_or_none(ci_stderr(low, high)))

    def guards_task(self, clause: Clause) -> bool:
        return True

    def bound(self, result: ClauseResult, model: nn.Module, data: VerifyData,
              confidence: float) -> Bound:
        return task_clause_bound(result, model, data, confidence)

    def examples_if_perfect(self, clause: Clause, level: float,
                            tasks: Sequence[str]) -> dict[str, int]:
        n = (examples_if_perfect(clause, level, drop=False)
             if clause.metric in UNIT_METRICS else None)
        return {} if n is None or clause.task is None else {clause.task: n}

    def lever(self, ctx: PlanContext, clause: Clause) -> ClauseLever | None:
        floor = (clause.at_least is not None if clause.metric != "loss"
                 else clause.at_most is not None)
        if not floor or clause.task is None:
            return None
        task_id = list(ctx.task_names).index(clause.task)
        obj = ctx.add(TaskLossWeight(ctx.model, task_id),
                      f"enforce:task-weight[{clause.task}][{clause.path}]")
        lever = ClauseLever(LeverKind.TASK_WEIGHT, f"extra loss weight on {clause.task}", [obj])
        assists = _assists(ctx, clause)
        for role, options, chooser in assists:
            for i, h in enumerate(options):  # every candidate but the first waits, idle
                cls = PatternObjective if i == 0 else StandbyPattern
                obj = ctx.add(ctx.on_task(cls(ctx.model, ctx.heads(h), role, kind="ce"),
                                          clause.task),
                              f"enforce:assist:{role}[{h}][{clause.path}]")
                lever.assists.append(obj)
                if chooser is not None:
                    lever.follows[obj.name] = Follows(chooser.index, str(h),
                                                      tuple(str(o) for o in options))
        if assists:
            lever.description += "; if it stops improving, the task's circuit: " + ", ".join(
                f"{role} on {options[0]}" if chooser is None else
                f"{role} on the one of {names(options)} {chooser.path} drives"
                for role, options, chooser in assists)
        left_out = ctx.fixed | _shaped(ctx.contract)
        free = [h for h in (Head(layer, head) for layer in range(ctx.n_layers)
                            for head in range(ctx.n_heads)) if h not in left_out]
        if free:
            lever.desaturation = [ctx.add(ctx.on_task(
                Desaturation(ctx.model, ctx.heads(free), min=DESATURATION_FLOOR), clause.task),
                f"enforce:desaturation[{clause.task}][{clause.path}]")]
            lever.description += ("; while its task learns nothing with a head saturated, an "
                                  f"entropy floor ({DESATURATION_FLOOR:g}) on {ctx.heads(free)}")
        return lever


def _shaped(contract: Iterable[Clause]) -> frozenset[Head]:
    """The heads whose attention a score clause asks for (its lever shapes their pattern, which
    an entropy floor would contradict)."""
    return frozenset(h for c in contract if c.entry is score.KIND for h in c.heads)


def metric_range(metric: str) -> tuple[float, float]:
    """The range of a task metric: [0, 1] for accuracies, nats >= 0 for the loss."""
    return (0.0, 1.0) if metric in UNIT_METRICS else (0.0, math.inf)


def _assists(ctx: PlanContext, clause: Clause) -> list[tuple[str, list[Head], Clause | None]]:
    """The task's circuit placed on heads the contract leaves to it: for each ``(role,
    layer)``, the head a path clause on the task implies that role for (``path.implied_roles``:
    the floor builds the circuit the contract names), else the first head of that layer that
    no clause names and no mask fixes, else the
    first whose every clause asks it for that very role (a score floor on ``role``: the
    assist pulls the way the contract does). Where those asked heads are several that one
    ``any_of`` floor on the role chooses among, the assist follows that clause's choice
    (``Follows``): it pulls the head the clause drives, not a second one (on
    kv_retrieval_circuit_3l at seed 3 an assist on L1.H0 beside the clause's L1.H1 left
    both at the induction plateau for 1,300 steps: docs/benchmarks.md). Each entry is
    ``(role, heads, the clause followed or None)``, one head unless one is followed. None
    when a layer has no such head, the model is too shallow, or the task has no circuit (none
    declared, and none of its training examples propose: ``RunStructure.circuits``)."""
    circuit = ctx.structure.circuits.get(clause.task or "", ())
    implied = {(role, h) for c in ctx.contract if c.entry is path.KIND and c.task == clause.task
               for role, h in path.implied_roles(ctx, c.edges[0], clause.task or "")}
    out: list[tuple[str, list[Head], Clause | None]] = []
    for role, layer in circuit:
        if layer >= ctx.n_layers:
            return []
        heads = [Head(layer, h) for h in range(ctx.n_heads) if Head(layer, h) not in ctx.fixed]
        on_path = [h for h in heads if (role, h) in implied]
        free = [h for h in heads if h not in ctx.named]
        asked = [h for h in heads if h in ctx.named and _asks_only(ctx.contract, h, role)]
        if on_path or free:
            out.append((role, [(on_path + free)[0]], None))
            continue
        if not asked:
            return []
        chooser = next((c for c in ctx.contract if c.quantifier == "any_of"
                        and c.entry is score.KIND and c.score == role
                        and sum(h in c.heads for h in asked) > 1), None)
        if chooser is None:
            out.append((role, asked[:1], None))
        else:
            out.append((role, [h for h in asked if h in chooser.heads], chooser))
    return out


def input_blind(targets: Tensor, metric: str) -> float:
    """``metric`` of the best answers that ignore the input, on these examples: at each
    position, always its most common target (for ``loss``, the targets' own distribution
    there: their entropy). ``targets`` (B, T) long, ``IGNORE`` where nothing is scored; token-
    weighted like ``accuracy`` and ``loss``, per example for ``exact``. A model no better than
    this has learned nothing from its input (``task_learned``)."""
    targets = targets.cpu()  # one copy: the counts below are host-side
    scored = targets != IGNORE
    total = int(scored.sum())
    if total == 0:
        return math.nan
    hits, nats = 0, 0.0
    blind = torch.full(targets.shape[1:], IGNORE, dtype=torch.long)
    for col in range(targets.shape[1]):
        values = targets[scored[:, col], col]
        if values.numel() == 0:
            continue
        counts = torch.bincount(values).double()
        seen = counts[counts > 0]
        hits += int(seen.max())
        nats -= float((seen * torch.log(seen / values.numel())).sum())
        blind[col] = int(counts.argmax())
    if metric == "accuracy":
        return hits / total
    if metric == "loss":
        return nats / total
    right = ((targets == blind[None]) | ~scored).all(1)
    return float(right[scored.any(1)].double().mean())


def task_learned(result: ClauseResult) -> bool | None:
    """Whether a task clause's task shows it learned something from its input: its measure's
    95% interval lies past what the input-blind answers get (``input_blind``; for ``loss``,
    below it). ``None`` for another kind of clause or without an interval."""
    clause, blind = result.clause, result.details.get("input_blind")
    if clause.entry is not KIND or blind is None or result.ci is None:
        return None
    low, high = result.ci
    if math.isnan(low) or math.isnan(high):
        return None
    return high < blind if clause.metric == "loss" else low > blind


def did_not_learn(results: Iterable[ClauseResult]) -> dict[str, str]:
    """Per task that a task clause among ``results`` shows has learned nothing from its input
    (``task_learned``): the words that say so, naming that clause and the input-blind answers'
    value. Every failing clause on that task waits on it, whatever its lever."""
    out: dict[str, str] = {}
    for r in results:
        name = r.clause.task or ""
        if name not in out and r.measured is not None and task_learned(r) is False:
            out[name] = (f"{name} did not learn: its {r.clause.metric} ({r.clause.path}, "
                         f"{fixed(r.measured)}) is no better than always answering each "
                         f"position with its most common target "
                         f"({fixed(r.details['input_blind'])}). No lever teaches a task that "
                         "has not started: another train.seed or train.lr, or a larger model "
                         "(where a plain run learns it, another clause's lever is in its way)")
    return out


def _asks_only(contract: Iterable[Clause], head: Head, role: str) -> bool:
    """Whether every clause naming ``head`` is a floor on its ``role`` score."""
    return all(c.entry is score.KIND and c.score == role and c.at_least is not None
               and c.at_most is None for c in contract if head in c.heads)


KIND = TaskKind()
