"""The registry entry of a clause kind: how clauses of the kind are parsed, described, measured,
levered and scored as a constraint.

Each kind is one ``ClauseKind`` subclass in its own module (``score``, ``ablation``,
``exclusive``, ``task``, ``preserve``), listed once in ``headwise.contract.kinds.KINDS``; a new
kind is one file plus one entry there (or passed to ``parse_contract(kinds=...)``). The parser
reads the registry; everything after it (verification, planning, enforcement, the run's
preparation, forecasts) reaches the kind through ``clause.entry`` and never compares kind
strings.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from torch import nn

from headwise.contract.clause import Clause, bounds_text, margin

if TYPE_CHECKING:
    from headwise.contract.lever import ClauseLever, PlanContext
    from headwise.contract.results import Bound, ClauseResult, VerifyData


@dataclass(frozen=True)
class ParseContext:
    """What a clause is parsed against: the model's shape and the spec's task names.

    ``n_kv_heads`` (``None``: one per head), ``has_mlp`` and ``post_norm`` complete the shape
    of the model's graph of paths (``path`` and ``circuit`` clauses)."""

    n_layers: int
    n_heads: int
    tasks: tuple[str, ...]
    n_kv_heads: int | None = None
    has_mlp: bool = True
    post_norm: bool = False


class ClauseKind(ABC):
    """One clause kind. Subclasses set ``name`` and ``keys`` and implement ``claims``,
    ``parse``, ``describe``, ``measured_on``, ``measure`` and ``lever``; the rest has defaults
    that fit a clause with a measured value and ``at_least``/``at_most`` bounds."""

    name: str = ""
    keys: frozenset[str] = frozenset()
    sharded: bool = True  # measurable on a model sharded by FSDP (False: reads whole weights)

    @abstractmethod
    def claims(self, raw: Mapping[str, Any]) -> bool:
        """Whether a raw clause mapping is of this kind (entries are asked in registry order)."""
        ...

    @abstractmethod
    def parse(self, path: str, index: int, raw: dict[str, Any], ctx: ParseContext) -> Clause:
        """The validated clause (``SpecError`` naming ``path.key`` on bad input)."""
        ...

    @abstractmethod
    def describe(self, clause: Clause) -> str:
        """One line: subject and what is measured."""
        ...

    def threshold_text(self, clause: Clause) -> str:
        return bounds_text(clause.at_least, clause.at_most)

    @abstractmethod
    def measured_on(self, clause: Clause) -> str:
        """What the clause is measured on, in words (``headwise plan``)."""
        ...

    def bounded(self, clause: Clause) -> list[tuple[tuple[Any, ...], str]]:
        """``(key, words)`` per quantity whose bounds other clauses of the contract must not
        contradict (the same key in two clauses: their bounds must overlap)."""
        return []

    def needs_clean(self, clause: Clause) -> list[tuple[tuple[Any, ...], float]]:
        """``(bounded key, value)``: the clause needs that quantity at least ``value`` (an
        accuracy drop of ``d`` needs a clean accuracy of at least ``d``)."""
        return []

    def check_together(self, clauses: Sequence[Clause]) -> None:
        """Reject clauses of this kind that contradict each other in a way ``bounded`` cannot
        express (``SpecError``); by default there is no such contradiction."""
        return None

    def measure_all(self, model: nn.Module, clauses: Sequence[Clause],
                    data: VerifyData) -> dict[int, ClauseResult]:
        """Every clause of this kind measured on ``data`` (``{index: result}``); one measurement
        pass may serve several clauses."""
        return {c.index: self.measure(model, c, data) for c in clauses}

    @abstractmethod
    def measure(self, model: nn.Module, clause: Clause, data: VerifyData) -> ClauseResult:
        ...

    def violation(self, result: ClauseResult, guard: float = 0.0) -> float:
        """Signed violation (``> 0``: fails by that much; ``< 0``: holds with that margin):
        ``-margin`` of the measured value, relative to the value for a ``loss`` metric above 1
        nat (1 when nothing could be measured). ``guard``: standard errors of the measurement
        (``ClauseResult.stderr``) the margin must also cover, so that the clause holds on an
        independent set too (``EnforceConfig.confidence``); 0: the bare margin."""
        c = result.clause
        if result.measured is None:
            return 1.0
        scale = max(abs(result.measured), 1.0) if c.metric == "loss" else 1.0
        spread = guard * (result.stderr or 0.0)
        return -(margin(result.measured, c.at_least, c.at_most) - spread) / scale

    def value_range(self, clause: Clause) -> tuple[float, float]:
        """The range the clause's measured value can take (its bounds are checked against it
        when parsed; forecasts clip to it); by default unbounded."""
        return (-math.inf, math.inf)

    def prepare(self, model: nn.Module, clauses: Sequence[Clause]) -> None:
        """Prepare ``model`` for this kind's ``clauses`` before training and before any trained
        weights load (``Contract.prepare``); by default nothing is needed."""
        return None

    def forecast_kind(self, clause: Clause) -> str | None:
        """The kind as the clause-verdict forecaster's features know it (its kind indicators,
        ``headwise.forecast.clauses.KIND_FEATURES``); ``None``: none of them."""
        return self.name

    def bound(self, result: ClauseResult, model: nn.Module, data: VerifyData,
              confidence: float) -> Bound:
        """The one-sided confidence bound of ``result`` at ``confidence``, and the test it
        inverts (``headwise.contract.certify``); by default none: a clause without a standard
        error holds but is never certified."""
        from headwise.contract.certify import unbounded

        return unbounded(result, confidence)

    def examples_if_perfect(self, clause: Clause, level: float,
                            tasks: Sequence[str]) -> dict[str, int]:
        """Per task (of ``tasks``, the spec's), the fewest of its verification examples at
        which the clause, measured at its best attainable value, is certified at p-value
        ``level`` (``Contract.verification_examples`` sizes the verification set by it).
        Empty where the clause alone sets no size: a loss, a role score or a distance is
        bounded by the spread the model shows, unknown before it is measured."""
        return {}

    def guards_task(self, clause: Clause) -> bool:
        """Whether the clause bounds a task's own performance (a task floor)."""
        return False

    def check_possible(self, ctx: PlanContext, clause: Clause) -> None:
        """Refuse a clause the run's structure makes impossible, before any training
        (``SpecError`` naming the clause and what forbids it: a structural mask, a gate); by
        default nothing does."""
        return None

    @abstractmethod
    def lever(self, ctx: PlanContext, clause: Clause) -> ClauseLever | None:
        """The clause's lever (``None``: nothing can move it), its objectives added to the run
        at weight 0."""
        ...
