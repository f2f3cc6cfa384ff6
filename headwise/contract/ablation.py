"""Ablation clauses: how much a task's metric drops when heads are ablated.

``{ablate: L1.H1, task: copy, metric: accuracy, drop_at_least: 0.3}`` (``ablate`` ablates the
set together; ``any_of`` / ``all_of`` ablate each head alone); ``mode`` is ``zero``, ``mean`` or
``resample``. Measured by ``ablation_importance`` on the task's held-out batch (accuracy: clean -
ablated; loss: ablated - clean) with a bootstrap CI. Levers (shared with exclusive clauses,
``ablation_lever``): for ``drop_at_least`` the carrier stages of ``EnforceConfig`` ("others":
the other heads of the set's layers stochastically ablated on the task's examples, so the set
becomes sufficient; "margin": a hinge on the set-ablated model's logits, so the task needs the
set); for ``drop_at_most`` the set stochastically ablated on the task's examples (``all_of``:
each head drawn on its own, so the model trains with each head alone missing, as measured).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from torch import nn

from headwise.analysis.importance import ablation_importance
from headwise.analysis.importance_matrix import ci_stderr
from headwise.contract import fields
from headwise.contract.certify import ablation_bound, any_of_heads, examples_if_perfect
from headwise.contract.clause import (
    METRICS,
    MODES,
    UNIT_METRICS,
    Clause,
    bounds_text,
    decide,
    number_or_none,
)
from headwise.contract.kind import ClauseKind, ParseContext
from headwise.contract.lever import ClauseLever, LeverKind, PlanContext, names
from headwise.contract.results import Bound, ClauseResult, VerifyData
from headwise.control.task_levers import AblatedMargin, StochasticAblation
from headwise.errors import SpecError
from headwise.heads import Head

SUBJECTS = ("ablate", "any_of", "all_of")
_PARTS = {"others": (StochasticAblation, "ablate {} on {} examples"),
          "self": (StochasticAblation, "ablate {} on {} examples"),
          "margin": (AblatedMargin, "hinge on {}-ablated {} examples")}


def drop_range(metric: str) -> tuple[float, float]:
    """The range of a drop in ``metric``: [-1, 1] for accuracies, unbounded for the loss."""
    return (-1.0, 1.0) if metric in UNIT_METRICS else (-math.inf, math.inf)


def drop_examples(clause: Clause, level: float) -> dict[str, int]:
    """``ClauseKind.examples_if_perfect`` of a clause on its task's accuracy or exact drop."""
    n = (examples_if_perfect(clause, level, drop=True)
         if clause.metric in UNIT_METRICS else None)
    return {} if n is None or clause.task is None else {clause.task: n}


class AblationKind(ClauseKind):
    name = "ablation"
    keys = frozenset({*SUBJECTS, "task", "metric", "mode", "drop_at_least", "drop_at_most",
                      "name"})

    def claims(self, raw: Mapping[str, Any]) -> bool:
        return ("ablate" in raw or any(str(k).startswith("drop_at") for k in raw)
                or ("task" in raw and ("any_of" in raw or "all_of" in raw)))

    def parse(self, path: str, index: int, raw: dict[str, Any], ctx: ParseContext) -> Clause:
        key, heads = fields.subject(path, raw, SUBJECTS, ctx.n_layers, ctx.n_heads)
        metric = fields.choice(path, raw, "metric", METRICS, "accuracy")
        mode = fields.choice(path, raw, "mode", MODES, "zero")
        task = fields.task(path, "task", raw.get("task"), ctx.tasks)
        lo, hi = fields.drop_bounds(path, raw, metric, *drop_range(metric))
        return Clause(index, self, "set" if key == "ablate" else key, heads, task=task,
                      metric=metric, mode=mode, at_least=lo, at_most=hi,
                      name=fields.name(path, raw), source=dict(raw))

    def describe(self, clause: Clause) -> str:
        return f"ablate {clause.subject()}: {clause.task} {clause.metric} ({clause.mode})"

    def value_range(self, clause: Clause) -> tuple[float, float]:
        return drop_range(clause.metric)

    def threshold_text(self, clause: Clause) -> str:
        return bounds_text(clause.at_least, clause.at_most, "drop ")

    def measured_on(self, clause: Clause) -> str:
        return f"held-out {clause.task} examples, ablated ({clause.mode})"

    def bounded(self, clause: Clause) -> list[tuple[tuple[Any, ...], str]]:
        if clause.quantifier == "any_of":
            return []
        units = [str(clause.heads)] if clause.quantifier == "set" else [str(h) for h in
                                                                        clause.heads]
        return [(("ablation", u, clause.task, clause.metric, clause.mode),
                 f"{u} {clause.task} {clause.metric} drop") for u in units]

    def needs_clean(self, clause: Clause) -> list[tuple[tuple[Any, ...], float]]:
        return clean_needed(clause, (clause.task or "",))

    def measure(self, model: nn.Module, clause: Clause, data: VerifyData) -> ClauseResult:
        c, task = clause, clause.task or ""
        batch = data.batch(task, c.path)
        groups = [c.heads] if c.quantifier == "set" else [str(h) for h in c.heads]
        imp = ablation_importance(model, {task: batch}, groups=groups,
                                  mode=c.mode,  # type: ignore[arg-type]
                                  n_boot=data.n_boot)
        values = {label: imp.get(label, task, c.metric) for label in imp.labels}
        passed, unit, value = decide(c, values)
        ci = imp.ci(unit, task, c.metric)
        return ClauseResult(c, passed, number_or_none(value), c.threshold_text(), unit,
                            {u: number_or_none(v) for u, v in values.items()},
                            ci, {"clean": imp.clean[task][c.metric]},
                            number_or_none(ci_stderr(*ci)))

    def check_possible(self, ctx: PlanContext, clause: Clause) -> None:
        if clause.at_least is not None and clause.at_least > 0:
            refuse_gated_drop(ctx, clause, clause.task or "")

    def bound(self, result: ClauseResult, model: nn.Module, data: VerifyData,
              confidence: float) -> Bound:
        return ablation_bound(result, model, data, confidence)

    def examples_if_perfect(self, clause: Clause, level: float,
                            tasks: Sequence[str]) -> dict[str, int]:
        return drop_examples(clause, level / any_of_heads(clause))

    def lever(self, ctx: PlanContext, clause: Clause) -> ClauseLever | None:
        task_ids = [list(ctx.task_names).index(clause.task or "")]
        return ablation_lever(ctx, clause, task_ids, [] if clause.at_most is None else task_ids)


def refuse_gated_drop(ctx: PlanContext, clause: Clause, task: str) -> None:
    """Refuse a positive drop demanded on ``task`` of heads its fixed gates switch off (the set
    ablated together, or each head alone: ``any_of`` needs one head on, others every one)."""
    off = ctx.gated_off(task)
    if not off:
        return
    heads = list(clause.heads)
    dead = [h for h in heads if h in off]
    impossible = (len(dead) == len(heads) if clause.quantifier in ("set", "any_of")
                  else bool(dead))
    if impossible:
        raise SpecError(f"{clause.path}: {clause.describe()} {clause.threshold_text()} cannot "
                        f"hold: the fixed gates switch {names(dead)} off on {task} examples "
                        "(heads.<selector>.tasks), so ablating them there changes nothing; "
                        f"expected heads that serve {task}")


def clean_needed(clause: Clause, tasks: tuple[str, ...]) -> list[tuple[tuple[Any, ...], float]]:
    """An accuracy (or exact) drop of at least ``d`` needs the clean metric at least ``d``."""
    if clause.at_least is None or clause.metric not in UNIT_METRICS:
        return []
    return [(("task", t, clause.metric), clause.at_least) for t in tasks]


def _others(heads: list[Head], n_heads: int) -> list[Head]:
    """Heads of the layers of ``heads`` that are not among them."""
    mine = set(heads)
    return [Head(l, h) for l in sorted({x.layer for x in mine}) for h in range(n_heads)
            if Head(l, h) not in mine]


def ablation_lever(ctx: PlanContext, clause: Clause, carried: list[int],
                   spared: list[int]) -> ClauseLever | None:
    """The lever of an ablation or exclusive clause: the carrier stages on the ``carried``
    task ids when the clause has ``at_least`` (the tasks must need the heads), and the heads
    stochastically ablated on the ``spared`` task ids (those tasks must not need them). An
    ``any_of`` clause (some head *alone* carries the task) gets the carrier stages per head,
    and only the head chosen at the first evaluation point is driven (``per_head``)."""
    units = ([[h] for h in clause.heads] if clause.quantifier == "any_of"
             and clause.at_least is not None else [list(clause.heads)])
    plans = [_parts(ctx, clause, heads, carried, spared) for heads in units]
    if not any(parts for parts, _ in plans):
        return None
    task_names = list(ctx.task_names)
    staged = len(ctx.config.carrier_stages) > 1 and plans[0][1]
    lever = ClauseLever(LeverKind.ABLATION, " | ".join("; ".join(
        _PARTS[what][1].format(names(heads), [task_names[i] for i in tasks])
        for what, heads, tasks in parts) for parts, _ in plans),
        scale=ctx.config.ablation_scale, cap=ctx.config.p_max,
        loss_from=ctx.config.staged_from if staged else 0.0,  # after p saturates
        perturbs=frozenset(task_names[i] for parts, _ in plans for _, _, tasks in parts
                           for i in tasks))
    if len(units) > 1:
        lever.description = ("per head, driven on the one chosen at the first evaluation "
                             f"point: {lever.description}")
    for unit, (parts, _) in zip(units, plans, strict=True):
        own = []
        for what, heads, tasks in parts:
            name = (f"enforce:{'ablate-' if what != 'margin' else ''}{what}[{names(heads)}]"
                    f"[{clause.path}]")
            obj = ctx.add(_PARTS[what][0](ctx.model, ctx.heads(heads), tasks,
                                          mode=clause.mode or "zero"), name)
            if what == "margin":
                lever.loss_terms.append(obj)  # a loss term: weight = multiplier excess, not p
            lever.objectives.append(obj)
            own.append(obj)
        if len(units) > 1:
            lever.per_head[str(unit[0])] = own
    return lever


def _parts(ctx: PlanContext, clause: Clause, heads: list[Head], carried: list[int],
           spared: list[int]) -> tuple[list[tuple[str, list[Head], list[int]]], bool]:
    """The lever's parts for ``heads`` (``(what, heads, task ids)``) and whether the first
    carrier stage is among them."""
    parts: list[tuple[str, list[Head], list[int]]] = []
    first_stage = False
    if clause.at_least is not None:
        others = _others(heads, ctx.n_heads)
        for i, stage in enumerate(ctx.config.carrier_stages):
            for part in stage:
                if part == "others" and others:
                    parts.append(("others", others, carried))
                    first_stage = first_stage or i == 0
                elif part == "margin":
                    parts.append(("margin", heads, carried))
    if spared:  # all_of: each head alone must be dispensable, so each is drawn on its own
        for group in ([[h] for h in heads] if clause.quantifier == "all_of" else [heads]):
            parts.append(("self", group, spared))
    return parts, first_stage


KIND = AblationKind()
