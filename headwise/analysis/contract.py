"""Specialization contracts: the clause and contract types that verification measures.

A contract is a list of clauses (YAML/JSON dicts); ``headwise.runspec.contract_from_list``
validates every clause (user input is checked in ``headwise.runspec``) and builds the
``Contract``; ``verify`` (``headwise.analysis.verify``) measures each clause. Clause kinds (full
reference in docs/contracts.md):

- score:     ``{head: L0.H0, score: previous_token, at_least: 0.9, on: probe}``
             ``{any_of: L1.*, score: induction, at_least: 0.45, on: probe}`` (``all_of`` too)
- ablation:  ``{ablate: L1.H1, task: copy, metric: accuracy, drop_at_least: 0.3}``
             (``ablate`` names a set ablated together; ``any_of``/``all_of`` ablate each head)
- exclusive: ``{heads: L1.H0-1, tasks: [sort], exclusive: true}``: ablating the set together
             drops each listed task by >= ``drop_at_least`` (default 0.1) and every other task
             by <= ``others_drop_at_most`` (default 0.02).
- task:      ``{task: copy, metric: accuracy, at_least: 0.95}``: the model still does its job
             (a task floor); ``metric`` is ``accuracy``, ``exact`` or ``loss``.

Errors are ``SpecError`` whose message starts with the clause path, e.g.
``contract[2].drop_at_least: got 'x', expected a number``.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from headwise.heads import Head, HeadSet

METRICS = ("accuracy", "exact", "loss")
# Metrics in [0, 1] whose drop is in [-1, 1]; ``loss`` is in nats (>= 0).
UNIT_METRICS = ("accuracy", "exact")
MODES = ("zero", "mean", "resample")
DEFAULT_EXCLUSIVE_DROP = 0.1
DEFAULT_OTHERS_DROP = 0.02


@dataclass(frozen=True)
class Clause:
    """One validated clause.

    Attributes:
        index: position in the contract (``path`` is ``contract[index]``).
        kind: ``"score"``, ``"ablation"``, ``"exclusive"`` or ``"task"``.
        quantifier: ``"head"`` (one head), ``"any_of"``, ``"all_of"``, ``"set"`` (a set
            ablated together: ``ablate`` / exclusive ``heads``) or ``"model"`` (task clauses).
        heads: the heads the clause is about (empty for task clauses).
        at_least, at_most: bounds on the measured value (score; drop; for exclusive clauses
            the listed tasks' drop lower bound and the other tasks' drop upper bound).
    """

    index: int
    kind: str
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
    name: str | None = None
    source: dict[str, Any] = field(default_factory=dict, compare=False)

    @property
    def path(self) -> str:
        return f"contract[{self.index}]"

    @property
    def target_heads(self) -> tuple[Head, ...]:
        """The heads a trainer could push to enforce this clause (objective or gate levers)."""
        return tuple(self.heads)

    @property
    def head(self) -> Head | None:
        """The single head of a ``head:`` clause, else ``None``."""
        return next(iter(self.heads)) if self.quantifier == "head" else None

    def threshold_text(self) -> str:
        """Human-readable bounds, e.g. ``>= 0.9`` or ``drop >= 0.3``."""
        if self.kind == "exclusive":
            return (f"drop on {list(self.tasks)} >= {self.at_least:g}; others <= "
                    f"{self.at_most:g}")
        prefix = "drop " if self.kind == "ablation" else ""
        parts = []
        if self.at_least is not None:
            parts.append(f"{prefix}>= {self.at_least:g}")
        if self.at_most is not None:
            parts.append(f"{prefix}<= {self.at_most:g}")
        return " and ".join(parts)

    def describe(self) -> str:
        """One line: subject and what is measured."""
        if self.kind == "task":
            return f"task {self.task}: {self.metric}"
        subject = (str(self.heads) if self.quantifier in ("head", "set")
                   else f"{self.quantifier} {self.source.get(self.quantifier)}")
        if self.kind == "score":
            return f"{subject}: {self.score} on {self.on or '(default probe)'}"
        if self.kind == "ablation":
            return f"ablate {subject}: {self.task} {self.metric} ({self.mode})"
        return f"{subject} exclusive to {list(self.tasks)} ({self.metric})"


class Contract:
    """A validated list of clauses for a model of ``n_layers`` x ``n_heads`` and known tasks
    (built by ``headwise.runspec.contract_from_list``)."""

    def __init__(self, clauses: Sequence[Clause], n_layers: int, n_heads: int,
                 tasks: Sequence[str]) -> None:
        self.clauses = list(clauses)
        self.n_layers, self.n_heads, self.tasks = n_layers, n_heads, list(tasks)

    @classmethod
    def from_list(cls, clauses: Any, n_layers: int, n_heads: int,
                  tasks: Sequence[str]) -> Contract:
        """Deprecated (0.2): use ``headwise.runspec.contract_from_list``, where user input is
        validated. Warns, then delegates; the one allowed upward import (removed in 0.3)."""
        warnings.warn("Contract.from_list is deprecated; use headwise.contract_from_list "
                      "(headwise.runspec.contract_from_list)", DeprecationWarning, stacklevel=2)
        from headwise.runspec.clauses import contract_from_list
        return contract_from_list(clauses, n_layers, n_heads, tasks)

    def to_list(self) -> list[dict[str, Any]]:
        """The clauses as given (JSON/YAML-ready)."""
        return [dict(c.source) for c in self.clauses]

    def __iter__(self) -> Iterator[Clause]:
        return iter(self.clauses)

    def __len__(self) -> int:
        return len(self.clauses)

    def __getitem__(self, i: int) -> Clause:
        return self.clauses[i]


