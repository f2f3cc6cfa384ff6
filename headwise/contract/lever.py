"""Enforcement settings, the lever a clause trains through, and what planning reads of a run.

``EnforceConfig`` holds every knob of ``--enforce`` (docs/contracts.md, "Enforcement"); it is
passed from the spec and command line through ``train_run`` to ``plan`` and the ``Enforcer``.
A ``ClauseLever`` is the set of objectives (``headwise.control.Objective`` loss terms) that one
clause's multiplier weights.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from statistics import NormalDist
from typing import Any, Protocol

from headwise.control.objectives import Objective
from headwise.control.task_levers import OnProbeData
from headwise.data import Batch
from headwise.errors import field_error
from headwise.heads import Head, HeadSet

ProbeSampler = Callable[[str, int, int], Batch]
"""``fn(probe name, n, seed) -> Batch``: ``n`` examples drawn like a named probe (the pipeline
passes ``headwise.pipeline.heldout.probe_sampler(spec)``)."""

# The lever of "H carries T": one stage of parts, or "others" then "margin" (see EnforceConfig).
STOPS = ("end", "first_hold")  # EnforceConfig.stop
CARRIER_STAGES = ((("others",), ("margin",)), (("others", "margin"),), (("others",),),
                  (("margin",),))


@dataclass(frozen=True)
class EnforceConfig:
    """The settings of contract enforcement.

    Attributes:
        eta: dual step per unit of violation: ``lambda <- clip(lambda + eta v, 0, lambda_max)``.
        lambda_max: cap on every multiplier.
        p_max: highest stochastic-ablation probability of an ablation lever.
        ablation_scale: ablation probability per unit of multiplier.
        margin: how far past its bound a bound lever aims, so held-out data holds too.
        carrier_stages: the lever of "H carries T" (``drop_at_least``) as stages of parts, each
            part ``"others"`` (the other heads of H's layers stochastically ablated: H becomes
            sufficient) or ``"margin"`` (a hinge on the H-ablated model's logits: H becomes
            necessary). The second of two stages starts once the first stage's ablation
            probability has reached ``p_max``, weighted by the multiplier's excess over ``p_max
            / ablation_scale``. One of ``CARRIER_STAGES``; default ``(("others",),
            ("margin",))``, chosen by measurement (docs/benchmarks.md).
        stop: ``"end"`` (train the whole budget with the constraints kept; keep the model of
            the last evaluation point at which the contract held on the enforcement set) or
            ``"first_hold"`` (stop at the first such point).
        assist_weight: the weight of a task floor's circuit assists once switched on, per
            unit of the task loss's weight (1 + the floor's extra weight): the assists keep
            their share of the gradient while the floor's multiplier rises.
        assist_patience: evaluation points a failing floor must go without improving by more
            than 0.01 before its assists switch on.
        confidence: how sure enforcement must be that a clause holding on the enforcement set
            holds on an independent set of the same size too (one-sided, normal
            approximation): a multiplier keeps rising until its clause holds with a margin of
            ``guard`` standard errors of its measurement, and the kept model is the last one
            at which every clause did (else the last at which the contract held). 0.5: the
            bare bound.

    Raises:
        ConfigError: a value out of range or carrier stages not in ``CARRIER_STAGES`` (the
            message names the field).
    """

    eta: float = 4.0
    lambda_max: float = 16.0
    p_max: float = 0.5
    ablation_scale: float = 0.15
    margin: float = 0.05
    carrier_stages: tuple[tuple[str, ...], ...] = (("others",), ("margin",))
    stop: str = "end"
    assist_weight: float = 1.0
    assist_patience: int = 3
    confidence: float = 0.95

    def __post_init__(self) -> None:
        if isinstance(self.confidence, bool) or not isinstance(
                self.confidence, (int, float)) or not 0.5 <= self.confidence < 1.0:
            raise field_error("confidence", self.confidence, "a probability in [0.5, 1)")
        if isinstance(self.assist_weight, bool) or not isinstance(
                self.assist_weight, (int, float)) or not self.assist_weight >= 0:
            raise field_error("assist_weight", self.assist_weight, "a number >= 0")
        if isinstance(self.assist_patience, bool) or not isinstance(
                self.assist_patience, int) or self.assist_patience < 1:
            raise field_error("assist_patience", self.assist_patience, "an integer >= 1")
        if self.stop not in STOPS:
            raise field_error("stop", self.stop, f"one of {list(STOPS)}")
        for name in ("eta", "lambda_max", "ablation_scale"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
                raise field_error(name, value, "a number > 0")
        if isinstance(self.p_max, bool) or not isinstance(self.p_max, (int, float)) \
                or not 0.0 < self.p_max <= 1.0:
            raise field_error("p_max", self.p_max, "a probability in (0, 1]")
        if isinstance(self.margin, bool) or not isinstance(self.margin, (int, float)) \
                or not 0.0 <= self.margin < 1.0:
            raise field_error("margin", self.margin, "a number in [0, 1)")
        given = stages = self.carrier_stages
        if isinstance(stages, (list, tuple)) and all(isinstance(x, (list, tuple)) for x in stages):
            stages = tuple(tuple(x) for x in stages)  # YAML gives lists
        if stages not in CARRIER_STAGES:
            raise field_error("carrier_stages", given,
                              f"one of {[[list(x) for x in c] for c in CARRIER_STAGES]}")
        object.__setattr__(self, "carrier_stages", stages)

    @property
    def guard(self) -> float:
        """Standard errors of the measurement a clause's margin must cover (``confidence``):
        ``z * sqrt(2)``, the spread of the difference between two independent sets' values."""
        return NormalDist().inv_cdf(self.confidence) * math.sqrt(2.0)

    @property
    def staged_from(self) -> float:
        """The multiplier from which a second carrier stage acts (first stage saturated)."""
        return self.p_max / self.ablation_scale


class Compiled(Protocol):
    """What planning reads of a compiled spec (``headwise.pipeline.compile.Compiled``)."""

    spec: Any
    model: Any
    objectives: list[Any]

    @property
    def task_names(self) -> tuple[str, ...]: ...


@dataclass
class ClauseLever:
    """A clause's lever: ``objectives`` whose weight is ``multiplier * scale`` (at most ``cap``).

    ``per_head`` (``any_of`` clauses) maps each head to its own objectives; only the head
    chosen at the first evaluation point is driven. ``loss_terms``: objectives that are loss
    terms rather than ablation probabilities (the carrier's margin), weighted ``max(0,
    multiplier - loss_from)``: ``loss_from`` is ``EnforceConfig.staged_from`` when they form
    a second stage, else 0. ``assists``: objectives the enforcer switches on (at
    ``EnforceConfig.assist_weight`` times the task loss's weight, 1 + the weight of
    ``objectives[0]``) once the clause fails and has stopped improving (a task floor's
    circuit assists). ``perturbs``: the tasks whose examples the lever degrades
    (an ablation lever ablates heads on them), so it backs off while a floor on one of them
    fails (``Enforcer.dual_step``).
    """

    kind: str
    description: str
    objectives: list[Objective] = field(default_factory=list)
    scale: float = 1.0
    cap: float | None = None
    per_head: dict[str, list[Objective]] = field(default_factory=dict)
    loss_terms: list[Objective] = field(default_factory=list)
    loss_from: float = 0.0
    assists: list[Objective] = field(default_factory=list)
    perturbs: frozenset[str] = frozenset()


@dataclass
class PlanContext:
    """What a clause kind's ``lever`` builds on: the compiled run, probe sampling, settings."""

    compiled: Compiled
    n_layers: int
    n_heads: int
    config: EnforceConfig
    probes: ProbeSampler | None = None
    data: Any = None  # the enforcement set (VerifyData), for checks that read a probe's shape
    named: set[Head] = field(default_factory=set)  # heads some clause of the contract names

    def heads(self, heads: Head | Sequence[Head]) -> HeadSet:
        items = [heads] if isinstance(heads, Head) else list(heads)
        return HeadSet(items, self.n_layers, self.n_heads)

    @property
    def masked(self) -> set[Head]:
        """Heads whose pattern a structural mask fixes."""
        return set(self.masks)

    @property
    def masks(self) -> dict[Head, str]:
        """Each structurally masked head and its mask's name."""
        return {h: r.mask.name for r in self.compiled.spec.heads if r.mask is not None
                for h in r.heads}

    def gated_off(self, task: str) -> set[Head]:
        """Heads that fixed task gates switch off on ``task``'s examples (their output is
        zero there, so ablating them changes nothing)."""
        gates = getattr(self.compiled, "gates", None)
        assignment = getattr(gates, "assignment", None)
        if assignment is None:  # no gates, or learned ones (they may open)
            return set()
        task_id = list(self.compiled.task_names).index(task)
        on = set(assignment.get(task_id, ()))
        return {Head(l, h) for l in gates.gates for h in range(self.n_heads)  # type: ignore[union-attr]
                if Head(l, h) not in on}

    def add(self, obj: Any, name: str) -> Any:
        """Add a lever objective to the run at weight 0 (names are unique: checkpoints store
        lever weights by name)."""
        obj.name = name
        obj.weight = 0.0
        self.compiled.objectives.append(obj)
        return obj

    def on_probe(self, obj: Any, name: str, clause: Any) -> Any:
        """``obj`` trained on batches drawn like the clause's probe (none, ``default`` or a
        task's name: on the training batches, which are drawn like the held-out task data).

        Raises:
            ValueError: the clause reads a probe and no ``probes`` sampler was given.
        """
        obj.name = name
        probe = clause.on
        if probe is None or probe == "default" or probe in self.compiled.task_names:
            return obj
        if self.probes is None:
            raise ValueError(f"plan: {clause.path} is measured on probe {probe!r}; pass "
                             "probes= (headwise.pipeline.heldout.probe_sampler)")
        sample = self.probes
        return OnProbeData(self.compiled.model, obj, lambda n, seed: sample(probe, n, seed))

    def reads_probe(self, clause: Any) -> bool:
        """Whether the clause's lever trains on probe-like batches (see ``on_probe``)."""
        return not (clause.on is None or clause.on == "default"
                    or clause.on in self.compiled.task_names)

def names(heads: Any) -> str:
    """``L0.H1,L1.H2``."""
    return ",".join(str(h) for h in heads)
