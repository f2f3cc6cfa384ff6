"""Verify a Contract on a model: measure every clause, give its value, threshold and verdict.

Measurement per clause kind (docs/contracts.md):

- score: ``role_scores`` of the clause's heads on the named probe (``on``; default the data's
  only or ``default`` probe). ``head``/``all_of``: every head must satisfy the bounds;
  ``any_of``: at least one. The *deciding head* is the one with the best margin (any_of) or the
  worst (all_of); its value is the clause's measured value. Margin = distance inside the bounds.
- ablation: ``ablation_importance`` drop (accuracy: clean - ablated; loss: ablated - clean) on
  the task's eval batch, with a bootstrap CI; ``ablate`` ablates the set together, ``any_of`` /
  ``all_of`` each head alone.
- exclusive: the set ablated together on every task; measured = the smallest drop on the listed
  tasks (>= ``drop_at_least``) and, in ``details``, the largest on the others (<=
  ``others_drop_at_most``).
- task: the task's own metric on its held-out batch (``accuracy`` token-weighted, ``exact`` per
  example, ``loss`` in nats), with the same paired-bootstrap CI machinery (``task_metric_ci``).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch
from rich.table import Table
from torch import Tensor, nn

from headwise.analysis.importance import ablation_importance, task_metric_ci
from headwise.analysis.numbers import fixed
from headwise.analysis.report_html import contract_html
from headwise.analysis.role_table import RoleTable
from headwise.analysis.roles import role_scores
from headwise.errors import SpecError
from headwise.heads import HeadSet
from headwise.model.eval_mode import eval_mode

if TYPE_CHECKING:
    from headwise.analysis.contract import Clause, Contract


@dataclass
class VerifyData:
    """Data a contract is measured on.

    Attributes:
        tasks: ``{task: batch}``; a batch has ``tokens``, ``targets``, ``attention_mask`` and
            ``task_ids`` (``headwise.data.Batch`` or any object with those attributes).
        probes: ``{name: tokens (B, T)}`` or objects with ``tokens`` (and optionally
            ``attention_mask``, ``task_ids``) for score clauses' ``on``.
        n_boot: bootstrap resamples for ablation CIs.
    """

    tasks: Mapping[str, Any] = field(default_factory=dict)
    probes: Mapping[str, Any] = field(default_factory=dict)
    n_boot: int = 200

    def probe(self, name: str | None, path: str) -> tuple[Tensor, Tensor | None, dict[str, Any]]:
        """(tokens, attention_mask, forward kwargs) of probe ``name``."""
        if name is None:
            if len(self.probes) == 1:
                name = next(iter(self.probes))
            elif "default" in self.probes:
                name = "default"
            else:
                raise SpecError(f"{path}.on: missing; expected one of the probes "
                                f"{sorted(self.probes)}")
        if name not in self.probes:
            raise SpecError(f"{path}.on: got {name!r}, expected one of the probes "
                            f"{sorted(self.probes)}")
        p = self.probes[name]
        if isinstance(p, Tensor):
            return p, None, {}
        kw = {"task_ids": p.task_ids} if getattr(p, "task_ids", None) is not None else {}
        return p.tokens, getattr(p, "attention_mask", None), kw


@dataclass
class ClauseResult:
    """Verdict of one clause: measured value, threshold text, pass/fail and the deciding head."""

    clause: Clause
    passed: bool
    measured: float | None
    threshold: str
    decided_by: str | None = None
    per_head: dict[str, float | None] = field(default_factory=dict)
    ci: tuple[float, float] | None = None
    details: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        c = self.clause
        return {"index": c.index, "path": c.path, "name": c.name, "kind": c.kind,
                "quantifier": c.quantifier, "clause": c.source, "description": c.describe(),
                "target_heads": [str(h) for h in c.target_heads], "measured": self.measured,
                "threshold": self.threshold, "at_least": c.at_least, "at_most": c.at_most,
                "passed": self.passed, "decided_by": self.decided_by,
                "per_head": self.per_head, "ci": list(self.ci) if self.ci else None,
                "details": self.details}


@dataclass
class ContractResult:
    """All clause verdicts; ``passed`` when every clause holds (``exit_code`` 0, else 1)."""

    results: list[ClauseResult]

    @property
    def passed(self) -> bool:
        return all(r.passed for r in self.results)

    @property
    def exit_code(self) -> int:
        return 0 if self.passed else 1

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready: ``{"passed", "n_clauses", "n_failed", "clauses": [...]}``."""
        return {"passed": self.passed, "n_clauses": len(self.results),
                "n_failed": sum(not r.passed for r in self.results),
                "clauses": [r.to_dict() for r in self.results]}

    def to_rich_table(self) -> Table:
        table = Table(title=f"contract: {'PASS' if self.passed else 'FAIL'}")
        for col in ("#", "clause", "measured", "threshold", "decided by", "verdict"):
            table.add_column(col)
        for r in self.results:
            m = "-" if r.measured is None else fixed(r.measured)
            if r.ci is not None and not any(math.isnan(x) for x in r.ci):
                m += f" [{fixed(r.ci[0])}, {fixed(r.ci[1])}]"
            table.add_row(str(r.clause.index), r.clause.name or r.clause.describe(), m,
                          r.threshold, r.decided_by or "",
                          "[green]pass[/green]" if r.passed else "[red]FAIL[/red]")
        return table

    def _repr_html_(self) -> str:
        """Jupyter rendering: the report's contract table."""
        return contract_html(self.to_dict())


def _ok(c: Clause, v: float) -> bool:
    if math.isnan(v):
        return False
    return ((c.at_least is None or v >= c.at_least) and (c.at_most is None or v <= c.at_most))


def _margin(c: Clause, v: float) -> float:
    if math.isnan(v):
        return -math.inf
    m = math.inf
    if c.at_least is not None:
        m = min(m, v - c.at_least)
    if c.at_most is not None:
        m = min(m, c.at_most - v)
    return m


def _decide(c: Clause, values: dict[str, float]) -> tuple[bool, str, float]:
    """(passed, deciding head, its value) for a head / any_of / all_of clause."""
    if c.quantifier == "any_of":
        best = max(values, key=lambda h: _margin(c, values[h]))
        return _ok(c, values[best]), best, values[best]
    worst = min(values, key=lambda h: _margin(c, values[h]))
    return all(_ok(c, v) for v in values.values()), worst, values[worst]


def _num(v: float) -> float | None:
    return None if math.isnan(v) else v


def verify(model: nn.Module, contract: Contract, data: VerifyData) -> ContractResult:
    """Measure every clause of ``contract`` on ``data``.

    Raises:
        SpecError: a clause names a probe or task that ``data`` lacks.
    """
    with eval_mode(model):
        tables = _score_tables(model, contract, data)
        results = []
        for c in contract:
            if c.kind == "score":
                results.append(_verify_score(c, tables[c.index]))
            elif c.kind == "ablation":
                results.append(_verify_ablation(model, c, data))
            elif c.kind == "task":
                results.append(_verify_task(model, c, data))
            else:
                results.append(_verify_exclusive(model, c, data))
        return ContractResult(results)


def _score_tables(model: nn.Module, contract: Contract, data: VerifyData) -> dict[int, RoleTable]:
    """One role_scores pass per probe over the union of its clauses' heads and scores."""
    by_probe: dict[str, list[Clause]] = {}
    resolved: dict[int, str] = {}
    for c in contract:
        if c.kind != "score":
            continue
        data.probe(c.on, c.path)  # validates the name
        name = c.on if c.on is not None else ("default" if "default" in data.probes
                                              else next(iter(data.probes)))
        resolved[c.index] = name
        by_probe.setdefault(name, []).append(c)
    out: dict[int, RoleTable] = {}
    for name, clauses in by_probe.items():
        tokens, mask, kw = data.probe(name, clauses[0].path)
        heads = HeadSet([h for c in clauses for h in c.heads], contract.n_layers,
                        contract.n_heads)
        roles = sorted({c.score for c in clauses if c.score})
        with torch.no_grad():
            table = role_scores(model, tokens, mask, heads=heads, roles=roles, **kw)
        table.info["probe"] = name
        for c in clauses:
            out[c.index] = table
    return out


def _verify_score(c: Clause, table: RoleTable) -> ClauseResult:
    assert c.score is not None
    values = {str(h): table.get(h, c.score) for h in c.heads}
    passed, head, value = _decide(c, values)
    return ClauseResult(c, passed, _num(value), c.threshold_text(), head,
                        {h: _num(v) for h, v in values.items()},
                        details={"probe": table.info.get("probe")})


def _batch(data: VerifyData, task: str, path: str) -> Any:
    if task not in data.tasks:
        raise SpecError(f"{path}.task: got {task!r}, expected one of the data's tasks "
                        f"{sorted(data.tasks)}")
    return data.tasks[task]


def _verify_ablation(model: nn.Module, c: Clause, data: VerifyData) -> ClauseResult:
    assert c.task is not None
    batch = _batch(data, c.task, c.path)
    groups = [c.heads] if c.quantifier == "set" else [str(h) for h in c.heads]
    imp = ablation_importance(model, {c.task: batch}, groups=groups, mode=c.mode,  # type: ignore[arg-type]
                              n_boot=data.n_boot)
    values = {label: imp.get(label, c.task, c.metric) for label in imp.labels}
    passed, unit, value = _decide(c, values)
    return ClauseResult(c, passed, _num(value), c.threshold_text(), unit,
                        {u: _num(v) for u, v in values.items()}, imp.ci(unit, c.task, c.metric),
                        {"clean": imp.clean[c.task][c.metric]})


def _verify_task(model: nn.Module, c: Clause, data: VerifyData) -> ClauseResult:
    assert c.task is not None
    value, low, high = task_metric_ci(model, _batch(data, c.task, c.path), c.metric,
                                      n_boot=data.n_boot)
    return ClauseResult(c, _ok(c, value), _num(value), c.threshold_text(), "the model",
                        ci=(low, high), details={"examples": int(_batch(data, c.task,
                                                                        c.path).tokens.shape[0])})


def _verify_exclusive(model: nn.Module, c: Clause, data: VerifyData) -> ClauseResult:
    for t in c.tasks:
        _batch(data, t, c.path)
    imp = ablation_importance(model, data.tasks, groups=[c.heads], mode=c.mode,  # type: ignore[arg-type]
                              n_boot=data.n_boot)
    label = imp.labels[0]
    drops = {t: imp.get(label, t, c.metric) for t in imp.tasks}
    listed = min(drops[t] for t in c.tasks)
    others = [drops[t] for t in drops if t not in c.tasks]
    other_max = max(others) if others else -math.inf
    assert c.at_least is not None and c.at_most is not None
    passed = listed >= c.at_least and (not others or other_max <= c.at_most)
    return ClauseResult(c, passed, _num(listed), c.threshold_text(), label,
                        details={"drops": {t: _num(v) for t, v in drops.items()},
                                 "others_max": None if not others else _num(other_max)})
