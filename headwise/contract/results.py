"""What a contract is measured on, and what measuring it gives: ``VerifyData``,
``ClauseResult`` (one clause's value, threshold, confidence bound and verdict), ``Bound`` and
``ContractResult`` (every clause, and the contract's family-wise level by Holm's step-down)."""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from rich.table import Table
from torch import Tensor

from headwise.confidence import DEFAULT_CONFIDENCE, holm
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


STATES = ("certified", "holds", "fails")
REQUIRE = ("holds", "certified")  # what exit code 0 asks of a contract (``--require``)


@dataclass(frozen=True)
class Bound:
    """A clause's one-sided confidence bounds at ``confidence`` and the test they invert.

    Attributes:
        method: ``clopper-pearson`` (exact binomial over examples), ``clopper-pearson
            (effective n)`` (the same at the Korn-Graubard effective sample size),
            ``normal`` (a bootstrap standard error), ``student-t`` (a grouped ratio
            estimator's standard error, ``df`` = groups - 1) or ``none`` (no bound).
        lower, upper: the bound on the side of ``at_least`` / ``at_most`` (``None`` for a side
            the clause does not bound).
        p_value: of H0 "the true value is on the wrong side of a bound" (the larger of the two
            sides': both must hold); ``None`` without a bound. The clause is certified when it
            is at most ``1 - confidence``, exactly when every bound is past its threshold.
        examples: the examples (or sequences) the bound rests on.
        needed: for a clause that holds, about how many examples would certify it at the
            measured margin and spread (fewer than ``examples`` when it is certified; ``None``:
            a clause that fails, or not computable, e.g. a margin of 0). An enforced run sizes
            its verification set from these numbers on the enforcement set
            (``headwise.contract.evidence``).
        note: how the bound was formed, in words.
    """

    method: str
    confidence: float
    lower: float | None = None
    upper: float | None = None
    p_value: float | None = None
    examples: int | None = None
    needed: int | None = None
    note: str = ""

    @property
    def certified(self) -> bool:
        return self.p_value is not None and self.p_value <= 1.0 - self.confidence

    def text(self) -> str:
        """``>= 0.873`` / ``<= 0.12`` / both, or ``-`` without a bound."""
        parts = [f"{op} {fixed(v)}" for op, v in ((">=", self.lower), ("<=", self.upper))
                 if v is not None]
        return " and ".join(parts) if parts else "-"

    def to_dict(self) -> dict[str, Any]:
        return {"method": self.method, "confidence": self.confidence, "lower": self.lower,
                "upper": self.upper, "p_value": self.p_value, "examples": self.examples,
                "needed": self.needed, "note": self.note}


@dataclass
class ClauseResult:
    """Verdict of one clause: measured value, threshold text, pass/fail, the deciding head and
    (after ``headwise.contract.verify``) its confidence ``bound``; ``state`` is ``certified``
    (the bound is past the threshold), ``holds`` (only the point estimate is) or ``fails``."""

    clause: Clause
    passed: bool
    measured: float | None
    threshold: str
    decided_by: str | None = None
    per_head: dict[str, float | None] = field(default_factory=dict)
    ci: tuple[float, float] | None = None
    details: dict[str, Any] = field(default_factory=dict)
    stderr: float | None = None  # of ``measured`` on its set (None: not estimated)
    bound: Bound | None = None

    @property
    def state(self) -> str:
        if not self.passed:
            return "fails"
        return "certified" if self.bound is not None and self.bound.certified else "holds"

    def to_dict(self) -> dict[str, Any]:
        c = self.clause
        return {"index": c.index, "path": c.path, "name": c.name, "kind": c.kind,
                "quantifier": c.quantifier, "clause": c.source, "description": c.describe(),
                "target_heads": [str(h) for h in c.heads], "measured": self.measured,
                "threshold": self.threshold, "at_least": c.at_least, "at_most": c.at_most,
                "passed": self.passed, "state": self.state,
                "bound": None if self.bound is None else self.bound.to_dict(),
                "decided_by": self.decided_by,
                "per_head": self.per_head, "ci": list(self.ci) if self.ci else None,
                "stderr": self.stderr, "details": self.details}


@dataclass
class ContractResult:
    """All clause verdicts; ``passed`` when every clause holds (``exit_code`` 0, else 1).

    ``confidence`` is the contract's level (``contract.confidence``): each clause's bound is
    one-sided at it, and the contract is ``certified`` when Holm's step-down over the clauses'
    p-values certifies every clause at family-wise level ``confidence`` (the chance that any
    certified clause is in truth on the wrong side of its bound is at most ``1 -
    confidence``)."""

    results: list[ClauseResult]
    confidence: float = DEFAULT_CONFIDENCE

    @property
    def passed(self) -> bool:
        return all(r.passed for r in self.results)

    @property
    def exit_code(self) -> int:
        return 0 if self.passed else 1

    def exit_for(self, require: str) -> int:
        """0 when the contract holds (``require="holds"``) or is certified at family-wise
        ``confidence`` (``"certified"``), else 1."""
        if require not in REQUIRE:
            raise ValueError(f"require: got {require!r}, expected one of {list(REQUIRE)}")
        return self.exit_code if require == "holds" else 0 if self.certified else 1

    @property
    def family_p(self) -> list[float]:
        """Holm-adjusted p-values, one per clause (1 for a clause that fails or has no
        bound)."""
        return holm([r.bound.p_value if r.passed and r.bound is not None
                     and r.bound.p_value is not None else 1.0 for r in self.results])

    @property
    def certified(self) -> bool:
        """Every clause certified at family-wise level ``confidence`` (Holm)."""
        return all(p <= 1.0 - self.confidence for p in self.family_p)

    @property
    def family_level(self) -> float:
        """The highest family-wise level at which every clause is certified: ``1 -`` the largest
        Holm-adjusted p-value (1 for an empty contract)."""
        return 1.0 - max(self.family_p, default=0.0)

    def headline(self) -> str:
        """``FAIL``, or ``PASS`` and whether every clause is certified at family-wise level."""
        if not self.passed:
            return "FAIL"
        level = f"{100 * self.confidence:g}%"
        if self.certified:
            return f"PASS; every clause certified at family-wise {level} (Holm)"
        unbounded = sum(r.bound is None or r.bound.p_value is None for r in self.results)
        why = (f"{unbounded} clause{'s have' if unbounded > 1 else ' has'} no bound" if unbounded
               else f"reached {100 * self.family_level:.1f}%")
        return f"PASS; not every clause certified at family-wise {level} (Holm; {why})"

    def evidence(self) -> list[str]:
        """One line per clause that holds but is not certified: its bound, and how many
        verification examples would certify it at the measured margin and spread."""
        out = []
        for r in self.results:
            b = r.bound
            if r.state != "holds" or b is None:
                continue
            if b.method == "none":
                out.append(f"{r.clause.path} holds but cannot be certified: {b.note}")
                continue
            knob = ("data.verify_examples" if r.clause.on is None
                    else "data.verify_examples, or the probe's examples")
            need = ("no number of examples certifies it at the measured margin and spread"
                    if b.needed is None else f"at the measured value and spread about "
                    f"{b.needed} examples would certify it ({knob})")
            out.append(f"{r.clause.path} holds but is not certified at "
                       f"{100 * b.confidence:g}%: bound {b.text()} ({b.method}, {b.examples} "
                       f"examples) against {r.threshold}; {need}")
        return out

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready: ``{"passed", "certified", "confidence", "family_level", "n_clauses",
        "n_failed", "n_certified", "clauses": [...]}`` (each clause with its ``family_p``)."""
        clauses = [{**r.to_dict(), "family_p": p}
                   for r, p in zip(self.results, self.family_p, strict=True)]
        return {"passed": self.passed, "certified": self.certified,
                "confidence": self.confidence, "family_level": self.family_level,
                "n_clauses": len(self.results),
                "n_failed": sum(not r.passed for r in self.results),
                "n_certified": sum(r.state == "certified" for r in self.results),
                "clauses": clauses}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], contract: Contract,
                  source: str) -> ContractResult:
        """The verdict ``to_dict`` wrote for ``contract`` (a run's ``contract.json``, parsed).

        Each entry must be the clause of ``contract`` at its index, as written (``clause``);
        the values are checked field by field, never evaluated. A verdict written before
        bounds were recorded reads back without them (its clauses hold, none is certified).

        Raises:
            CheckpointError: a missing or mistyped field, or a verdict of another contract
                (naming ``source`` and the field).
        """
        clauses = data.get("clauses")
        if not isinstance(clauses, list) or len(clauses) != len(contract):
            raise CheckpointError(f"{source}: clauses: expected a list of the {len(contract)} "
                                  "clauses of the run's contract")
        confidence = data.get("confidence", contract.confidence)
        if isinstance(confidence, bool) or not isinstance(confidence, _NUMBER) \
                or not 0.5 <= confidence < 1:
            raise CheckpointError(f"{source}: confidence: expected a number in [0.5, 1)")
        return cls([_clause_result(entry, clause, f"{source}: clauses[{i}]")
                    for i, (entry, clause) in enumerate(zip(clauses, contract, strict=True))],
                   float(confidence))

    def to_rich_table(self) -> Table:
        table = Table(title=f"contract: {self.headline()}")
        for col in ("#", "clause", "measured", f"{100 * self.confidence:g}% bound", "threshold",
                    "decided by", "verdict"):
            table.add_column(col)
        for r in self.results:
            m = "-" if r.measured is None else fixed(r.measured)
            if r.ci is not None and not any(math.isnan(x) for x in r.ci):
                m += f" [{fixed(r.ci[0])}, {fixed(r.ci[1])}]"
            table.add_row(str(r.clause.index), r.clause.label, m,
                          "-" if r.bound is None else f"{r.bound.text()} ({r.bound.method})",
                          r.threshold, r.decided_by or "", _STATE_MARKUP[r.state])
        return table

    def _repr_html_(self) -> str:
        """Jupyter rendering: the report's contract table."""
        return contract_html(self.to_dict())


_STATE_MARKUP = {"certified": "[green]certified[/green]", "holds": "[yellow]holds[/yellow]",
                 "fails": "[red]FAIL[/red]"}
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
        stderr=get("stderr", _NUMBER, "a number or null", optional=True),
        bound=_bound(entry.get("bound"), f"{where}.bound"))


def _bound(entry: Any, where: str) -> Bound | None:
    """A ``Bound.to_dict`` entry read back (``None`` stays ``None``)."""
    if entry is None:
        return None
    if not isinstance(entry, dict):
        raise CheckpointError(f"{where}: expected an object or null")
    typed: dict[str, tuple[tuple[type, ...], str]] = {
        "method": ((str,), "a string"), "confidence": (_NUMBER, "a number"),
        "lower": (_NUMBER, "a number or null"), "upper": (_NUMBER, "a number or null"),
        "p_value": (_NUMBER, "a number or null"), "examples": ((int,), "an integer or null"),
        "needed": ((int,), "an integer or null"), "note": ((str,), "a string")}
    values: dict[str, Any] = {}
    for name, (types, expected) in typed.items():
        value = entry.get(name)
        if not ((isinstance(value, types) and not isinstance(value, bool))
                or (value is None and expected.endswith("or null"))):
            raise CheckpointError(f"{where}.{name}: expected {expected}")
        values[name] = value
    return Bound(**values)
