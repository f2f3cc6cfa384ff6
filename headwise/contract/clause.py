"""The clause and contract types; a measured value's signed margin to its bounds is
``headwise.bounds.margin`` (forecasts read it too).

A contract is a list of clauses parsed once (``headwise.contract.parse_contract``) into frozen
``Clause`` objects. Each clause holds its kind's registry entry (``Clause.entry``, a
``ClauseKind``; the kinds are listed in ``headwise.contract.kinds``), which parses, describes,
measures and enforces clauses of that kind: everything reaches the kind through
``clause.entry``. Full reference: docs/contracts.md.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from headwise.bounds import margin
from headwise.confidence import DEFAULT_CONFIDENCE
from headwise.heads import Head, HeadSet

if TYPE_CHECKING:
    from torch import nn

    from headwise.contract.kind import ClauseKind

METRICS = ("accuracy", "exact", "loss")
# Metrics in [0, 1] whose drop is in [-1, 1]; ``loss`` is in nats (>= 0).
UNIT_METRICS = ("accuracy", "exact")
MODES = ("zero", "mean", "resample")


@dataclass(frozen=True)
class Clause:
    """One validated clause.

    Attributes:
        index: position in the contract (``path`` is ``contract[index]``).
        entry: the clause kind's registry entry (``kind`` is its name).
        quantifier: ``"head"`` (one head), ``"any_of"``, ``"all_of"``, ``"set"`` (a set
            ablated together: ``ablate`` / exclusive ``heads``) or ``"model"`` (task clauses).
        heads: the heads the clause is about (empty for task clauses).
        at_least, at_most: bounds on the measured value (score; drop; for exclusive clauses
            the listed tasks' drop lower bound and the other tasks' drop upper bound).
        edges: the edges (and nodes) of a ``path`` or ``circuit`` clause
            (``headwise.hooks.graph``); empty for the others.
        source: the clause as written (JSON/YAML-ready).
    """

    index: int
    entry: ClauseKind = field(repr=False)
    quantifier: str
    heads: HeadSet
    score: str | None = None
    on: str | None = None
    task: str | None = None
    tasks: tuple[str, ...] = ()
    metric: str = "accuracy"
    mode: str = "zero"
    at_least: float | None = None
    at_most: float | None = None
    edges: tuple[Any, ...] = ()
    name: str | None = None
    source: dict[str, Any] = field(default_factory=dict, compare=False)

    @property
    def kind(self) -> str:
        """The kind's name (``"score"``, ``"ablation"``, ``"exclusive"``, ``"task"``,
        ``"preserve"``, or a kind registered from outside)."""
        return self.entry.name

    @property
    def path(self) -> str:
        return f"contract[{self.index}]"

    @property
    def label(self) -> str:
        """The clause's ``name`` if the user gave one, else its description."""
        return self.name or self.describe()

    @property
    def head(self) -> Head | None:
        """The single head of a ``head:`` clause, else ``None``."""
        return next(iter(self.heads)) if self.quantifier == "head" else None

    def subject(self) -> str:
        """The heads as written: ``L1.H0``, or ``any_of L1.*``."""
        if self.quantifier in ("head", "set"):
            return str(self.heads)
        return f"{self.quantifier} {self.source.get(self.quantifier)}"

    def threshold_text(self) -> str:
        """Human-readable bounds, e.g. ``>= 0.9`` or ``drop >= 0.3``."""
        return self.entry.threshold_text(self)

    def describe(self) -> str:
        """One line: subject and what is measured."""
        return self.entry.describe(self)

    def measured_on(self) -> str:
        """What the clause is measured on, in words (``headwise plan``)."""
        return self.entry.measured_on(self)


def bounds_text(at_least: float | None, at_most: float | None, prefix: str = "") -> str:
    """``>= 0.9 and <= 1`` (each part only when its bound is set), after ``prefix``."""
    parts = []
    if at_least is not None:
        parts.append(f"{prefix}>= {at_least:g}")
    if at_most is not None:
        parts.append(f"{prefix}<= {at_most:g}")
    return " and ".join(parts)


def holds(value: float, at_least: float | None, at_most: float | None) -> bool:
    """Whether ``value`` lies within its bounds (NaN never does)."""
    return margin(value, at_least, at_most) >= 0.0


@dataclass(frozen=True)
class Contract:
    """A validated list of clauses for a model of ``n_layers`` x ``n_heads`` and its tasks
    (built by ``headwise.contract.parse_contract``; empty when a spec has none); ``confidence``
    is the level of each clause's one-sided bound (``contract.confidence`` in a spec)."""

    clauses: tuple[Clause, ...]
    n_layers: int
    n_heads: int
    tasks: tuple[str, ...]
    confidence: float = DEFAULT_CONFIDENCE

    @classmethod
    def empty(cls, n_layers: int, n_heads: int, tasks: Sequence[str]) -> Contract:
        return cls((), n_layers, n_heads, tuple(tasks))

    def to_list(self) -> list[dict[str, Any]]:
        """The clauses as given (JSON/YAML-ready)."""
        return [dict(c.source) for c in self.clauses]

    def __iter__(self) -> Iterator[Clause]:
        return iter(self.clauses)

    def __len__(self) -> int:
        return len(self.clauses)

    def __getitem__(self, i: int) -> Clause:
        return self.clauses[i]

    def verification_examples(self, shares: Mapping[str, float]) -> int:
        """The fewest verification examples at which a model meeting every clause at its best
        attainable value would be certified whole at the family-wise level: each clause's
        size (``ClauseKind.examples_if_perfect``) at Holm's strictest level ``(1 -
        confidence) / m`` for ``m`` clauses, divided by its task's share of the mixture
        (``shares``: task -> weight, normalised). 0 when no clause sets a size. The data
        section's default ``verify_examples`` is at least this (docs/spec.md)."""
        if not self.clauses:
            return 0
        total = sum(shares.values())
        level = (1.0 - self.confidence) / len(self.clauses)
        need = 0
        for c in self.clauses:
            for task, n in c.entry.examples_if_perfect(c, level, self.tasks).items():
                need = max(need, math.ceil(n * total / shares[task]))
        return need

    @property
    def named_heads(self) -> frozenset[Head]:
        """Every head some clause names (what a ``role_drift`` preserve clause leaves out)."""
        return frozenset(h for c in self.clauses for h in c.heads)

    def prepare(self, model: nn.Module) -> None:
        """What the run must prepare on ``model`` before training and before any trained
        weights load, asked of each kind once with its clauses (``ClauseKind.prepare``: a
        ``preserve`` clause captures the starting model)."""
        kinds: dict[str, list[Clause]] = {}
        for c in self.clauses:
            kinds.setdefault(c.kind, []).append(c)
        for clauses in kinds.values():
            clauses[0].entry.prepare(model, clauses)


def decide(clause: Clause, values: dict[str, float]) -> tuple[bool, str, float]:
    """``(holds, deciding unit, its value)`` over per-head (or per-set) values: ``any_of``
    holds when one unit does and is decided by the best margin; ``head``, ``all_of`` and
    ``set`` hold when every unit does and are decided by the worst."""
    def m(unit: str) -> float:
        return margin(values[unit], clause.at_least, clause.at_most)

    if clause.quantifier == "any_of":
        best = max(values, key=m)
        return m(best) >= 0.0, best, values[best]
    worst = min(values, key=m)
    return m(worst) >= 0.0, worst, values[worst]


def number_or_none(v: float) -> float | None:
    """``None`` for NaN (JSON has no NaN), else ``v``."""
    return None if math.isnan(v) else v
