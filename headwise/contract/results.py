"""What a contract is measured on, and what measuring it gives: ``VerifyData``,
``ClauseResult`` (one clause's value, threshold and verdict) and ``ContractResult``."""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from rich.table import Table
from torch import Tensor

from headwise.contract.clause import Clause, Contract
from headwise.control.base_reference import BaseReference
from headwise.errors import CheckpointError, SpecError
from headwise.heads import Head
from headwise.render.html import contract_html
from headwise.render.numbers import fixed


@dataclass
class VerifyData:
    """Data a contract is measured on.

    Attributes:
        tasks: ``{task: batch}``; a batch has ``tokens``, ``targets``, ``attention_mask`` and
            ``task_ids`` (``headwise.data.Batch`` or any object with those attributes).
        probes: ``{name: tokens (B, T)}`` or objects with ``tokens`` (and optionally
            ``attention_mask``, ``task_ids``) for score clauses' ``on``.
        n_boot: bootstrap resamples for ablation CIs.
        base: the starting model ``preserve`` clauses compare with
            (``headwise.control.capture_base``, taken before training).
        named: the heads the contract's clauses name (``headwise.contract.preserve
            .named_heads``); a ``role_drift`` clause measures every other head.
    """

    tasks: Mapping[str, Any] = field(default_factory=dict)
    probes: Mapping[str, Any] = field(default_factory=dict)
    n_boot: int = 200
    base: BaseReference | None = None
    named: frozenset[Head] | None = None

    def probe_name(self, name: str | None, path: str) -> str:
        """The probe a clause at ``path`` reads: ``name``, or by default the only probe or the
        one called ``default``.

        Raises:
            SpecError: no such probe, or no default to fall back on.
        """
        if name is None:
            if len(self.probes) == 1:
                return next(iter(self.probes))
            if "default" in self.probes:
                return "default"
            raise SpecError(f"{path}.on: missing; expected one of the probes "
                            f"{sorted(self.probes)}")
        if name not in self.probes:
            raise SpecError(f"{path}.on: got {name!r}, expected one of the probes "
                            f"{sorted(self.probes)}")
        return name

    def probe(self, name: str | None, path: str) -> tuple[Tensor, Tensor | None, dict[str, Any]]:
        """(tokens, attention_mask, forward kwargs) of probe ``name`` (see ``probe_name``)."""
        name = self.probe_name(name, path)
        p = self.probes[name]
        if isinstance(p, Tensor):
            return p, None, {}
        kw = {"task_ids": p.task_ids} if getattr(p, "task_ids", None) is not None else {}
        return p.tokens, getattr(p, "attention_mask", None), kw

    def base_reference(self, path: str) -> BaseReference:
        """The starting model (``SpecError`` naming ``path.preserve`` if none was captured)."""
        if self.base is None:
            raise SpecError(f"{path}.preserve: got no starting model to compare with, expected "
                            "one captured before training (headwise.control.capture_base, "
                            "passed as VerifyData.base)")
        return self.base

    def batch(self, task: str, path: str) -> Any:
        """The held-out batch of ``task`` (``SpecError`` naming ``path.task`` if absent)."""
        if task not in self.tasks:
            raise SpecError(f"{path}.task: got {task!r}, expected one of the data's tasks "
                            f"{sorted(self.tasks)}")
        return self.tasks[task]


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
    stderr: float | None = None  # of ``measured`` on its set (None: not estimated)

    def to_dict(self) -> dict[str, Any]:
        c = self.clause
        return {"index": c.index, "path": c.path, "name": c.name, "kind": c.kind,
                "quantifier": c.quantifier, "clause": c.source, "description": c.describe(),
                "target_heads": [str(h) for h in c.heads], "measured": self.measured,
                "threshold": self.threshold, "at_least": c.at_least, "at_most": c.at_most,
                "passed": self.passed, "decided_by": self.decided_by,
                "per_head": self.per_head, "ci": list(self.ci) if self.ci else None,
                "stderr": self.stderr, "details": self.details}


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

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], contract: Contract,
                  source: str) -> ContractResult:
        """The verdict ``to_dict`` wrote for ``contract`` (a run's ``contract.json``, parsed).

        Each entry must be the clause of ``contract`` at its index, as written (``clause``);
        the values are checked field by field, never evaluated.

        Raises:
            CheckpointError: a missing or mistyped field, or a verdict of another contract
                (naming ``source`` and the field).
        """
        clauses = data.get("clauses")
        if not isinstance(clauses, list) or len(clauses) != len(contract):
            raise CheckpointError(f"{source}: clauses: expected a list of the {len(contract)} "
                                  "clauses of the run's contract")
        return cls([_clause_result(entry, clause, f"{source}: clauses[{i}]")
                    for i, (entry, clause) in enumerate(zip(clauses, contract, strict=True))])

    def to_rich_table(self) -> Table:
        table = Table(title=f"contract: {'PASS' if self.passed else 'FAIL'}")
        for col in ("#", "clause", "measured", "threshold", "decided by", "verdict"):
            table.add_column(col)
        for r in self.results:
            m = "-" if r.measured is None else fixed(r.measured)
            if r.ci is not None and not any(math.isnan(x) for x in r.ci):
                m += f" [{fixed(r.ci[0])}, {fixed(r.ci[1])}]"
            table.add_row(str(r.clause.index), r.clause.label, m,
                          r.threshold, r.decided_by or "",
                          "[green]pass[/green]" if r.passed else "[red]FAIL[/red]")
        return table

    def _repr_html_(self) -> str:
        """Jupyter rendering: the report's contract table."""
        return contract_html(self.to_dict())


_NUMBER = (int, float)


def _clause_result(entry: Any, clause: Clause, where: str) -> ClauseResult:
    """One ``ClauseResult.to_dict`` entry read back for ``clause``."""
    if not isinstance(entry, dict):
        raise CheckpointError(f"{where}: expected an object")

    def get(name: str, types: tuple[type, ...], expected: str, optional: bool = False) -> Any:
        value = entry.get(name)
        # bool is an int in Python: a number field refuses true/false
        typed = isinstance(value, types) and (bool in types or not isinstance(value, bool))
        if typed or (value is None and optional):
            return value
        raise CheckpointError(f"{where}.{name}: expected {expected}")

    as_written = json.loads(json.dumps(clause.source, default=str))
    if entry.get("index") != clause.index or entry.get("clause") != as_written:
        raise CheckpointError(f"{where}: expected the verdict of {clause.path} "
                              f"({clause.describe()}) as the run's spec states it")
    per_head = get("per_head", (dict,), "an object of numbers")
    if not all(isinstance(k, str) and (v is None or isinstance(v, _NUMBER))
               for k, v in per_head.items()):
        raise CheckpointError(f"{where}.per_head: expected an object of numbers")
    ci = get("ci", (list,), "a list of two numbers or null", optional=True)
    if ci is not None and (len(ci) != 2 or not all(isinstance(x, _NUMBER) for x in ci)):
        raise CheckpointError(f"{where}.ci: expected a list of two numbers or null")
    return ClauseResult(
        clause, passed=get("passed", (bool,), "true or false"),
        measured=get("measured", _NUMBER, "a number or null", optional=True),
        threshold=get("threshold", (str,), "a string"),
        decided_by=get("decided_by", (str,), "a string or null", optional=True),
        per_head=per_head, ci=None if ci is None else (float(ci[0]), float(ci[1])),
        details=get("details", (dict,), "an object"),
        stderr=get("stderr", _NUMBER, "a number or null", optional=True))
