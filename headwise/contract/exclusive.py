"""Exclusive clauses: a head set serves the listed tasks and no other.

``{heads: L1.H0-1, tasks: [sort], exclusive: true}``: ablating the set together drops each
listed task by at least ``drop_at_least`` (default 0.1) and every other task by at most
``others_drop_at_most`` (default 0.02). The measured value is the smallest listed drop; the
largest other drop is in ``details``. Bound: each task's drop bounded at the contract's level,
certified when every one is (``headwise.contract.certify.exclusive_bound``). Lever: the
ablation clause's carrier on the listed tasks, the set stochastically ablated on the others.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from torch import nn

from headwise.analysis.importance import ablation_importance
from headwise.contract import fields
from headwise.contract.ablation import ablation_lever, clean_needed, refuse_gated_drop
from headwise.contract.certify import examples_if_perfect, exclusive_bound
from headwise.contract.clause import METRICS, MODES, UNIT_METRICS, Clause, number_or_none
from headwise.contract.kind import ClauseKind, ParseContext
from headwise.contract.lever import ClauseLever, PlanContext
from headwise.contract.results import Bound, ClauseResult, VerifyData
from headwise.errors import SpecError
from headwise.heads import Head

DEFAULT_EXCLUSIVE_DROP = 0.1
DEFAULT_OTHERS_DROP = 0.02


class ExclusiveKind(ClauseKind):
    name = "exclusive"
    keys = frozenset({"heads", "tasks", "exclusive", "metric", "mode", "drop_at_least",
                      "others_drop_at_most", "name"})

    def claims(self, raw: Mapping[str, Any]) -> bool:
        return "exclusive" in raw

    def parse(self, path: str, index: int, raw: dict[str, Any], ctx: ParseContext) -> Clause:
        _, heads = fields.subject(path, raw, ("heads",), ctx.n_layers, ctx.n_heads)
        metric = fields.choice(path, raw, "metric", METRICS, "accuracy")
        mode = fields.choice(path, raw, "mode", MODES, "zero")
        if raw.get("exclusive") is not True:
            raise SpecError(f"{path}.exclusive: got {raw.get('exclusive')!r}, expected true")
        listed = raw.get("tasks")
        if isinstance(listed, str):
            listed = [listed]
        if not isinstance(listed, (list, tuple)) or not listed:
            raise SpecError(f"{path}.tasks: got {listed!r}, expected a non-empty list of task "
                            "names")
        tasks = tuple(fields.task(path, f"tasks[{j}]", t, ctx.tasks) for j, t in enumerate(listed))
        lo = fields.number(path, raw, "drop_at_least")
        hi = fields.number(path, raw, "others_drop_at_most")
        lo = DEFAULT_EXCLUSIVE_DROP if lo is None else lo
        hi = DEFAULT_OTHERS_DROP if hi is None else hi
        if lo <= hi:
            raise SpecError(f"{path}: drop_at_least {lo} must exceed others_drop_at_most {hi} "
                            "for exclusivity to mean anything")
        if metric in UNIT_METRICS and not (-1.0 <= hi and lo <= 1.0):
            raise SpecError(f"{path}.drop_at_least: got {lo}, expected an {metric} drop in "
                            "[-1, 1]")
        return Clause(index, self, "set", heads, tasks=tasks, metric=metric, mode=mode,
                      at_least=lo, at_most=hi, name=fields.name(path, raw), source=dict(raw))

    def describe(self, clause: Clause) -> str:
        return f"{clause.subject()} exclusive to {list(clause.tasks)} ({clause.metric})"

    def threshold_text(self, clause: Clause) -> str:
        return (f"drop on {list(clause.tasks)} >= {clause.at_least:g}; others <= "
                f"{clause.at_most:g}")

    def measured_on(self, clause: Clause) -> str:
        return "every task's held-out examples, the set ablated"

    def needs_clean(self, clause: Clause) -> list[tuple[tuple[Any, ...], float]]:
        return clean_needed(clause, clause.tasks)

    def check_together(self, clauses: Sequence[Clause]) -> None:
        """A head cannot be exclusive to two different task lists."""
        exclusive: dict[Head, Clause] = {}
        for c in clauses:
            for h in c.heads:
                other = exclusive.get(h)
                if other is not None and set(other.tasks) != set(c.tasks):
                    raise SpecError(f"{c.path}: {h} is required exclusive to {list(c.tasks)} "
                                    f"here and to {list(other.tasks)} in {other.path}")
                exclusive[h] = c

    def measure(self, model: nn.Module, clause: Clause, data: VerifyData) -> ClauseResult:
        c = clause
        for t in c.tasks:
            data.batch(t, c.path)
        imp = ablation_importance(model, data.tasks, groups=[c.heads],
                                  mode=c.mode,  # type: ignore[arg-type]
                                  n_boot=data.n_boot)
        label = imp.labels[0]
        drops = {t: imp.get(label, t, c.metric) for t in imp.tasks}
        listed = min(drops[t] for t in c.tasks)
        others = [drops[t] for t in drops if t not in c.tasks]
        other_max = max(others) if others else -math.inf
        assert c.at_least is not None and c.at_most is not None
        passed = listed >= c.at_least and (not others or other_max <= c.at_most)
        return ClauseResult(c, passed, number_or_none(listed), c.threshold_text(), label,
                            details={"drops": {t: number_or_none(v) for t, v in drops.items()},
                                     "others_max": None if not others else
                                     number_or_none(other_max)})

    def violation(self, result: ClauseResult, guard: float = 0.0) -> float:
        """The larger of the listed tasks' shortfall and the other tasks' excess (no standard
        error is estimated for the pair, so ``guard`` adds nothing)."""
        c = result.clause
        if result.measured is None:
            return 1.0
        others = result.details.get("others_max")
        v = (c.at_least or 0.0) - result.measured
        if others is not None and c.at_most is not None:
            v = max(v, others - c.at_most)
        return v

    def check_possible(self, ctx: PlanContext, clause: Clause) -> None:
        if clause.at_least is not None and clause.at_least > 0:
            for task in clause.tasks:
                refuse_gated_drop(ctx, clause, task)

    def bound(self, result: ClauseResult, model: nn.Module, data: VerifyData,
              confidence: float) -> Bound:
        return exclusive_bound(result, model, data, confidence)

    def examples_if_perfect(self, clause: Clause, level: float,
                            tasks: Sequence[str]) -> dict[str, int]:
        """Each task's drop on its side: the listed tasks' floor, the others' cap."""
        if clause.metric not in UNIT_METRICS:
            return {}
        assert clause.at_least is not None and clause.at_most is not None
        out = {}
        for task in tasks:
            side = (("at_least", clause.at_least) if task in clause.tasks
                    else ("at_most", clause.at_most))
            n = examples_if_perfect(clause, level, drop=True, sides=[side])
            if n is not None:
                out[task] = n
        return out

    def lever(self, ctx: PlanContext, clause: Clause) -> ClauseLever | None:
        task_names = list(ctx.task_names)
        carried = [task_names.index(t) for t in clause.tasks]
        spared = [i for i in range(len(task_names)) if i not in carried]
        return ablation_lever(ctx, clause, carried, spared)


KIND = ExclusiveKind()
