"""Enforcement settings, the lever a clause trains through, and what planning reads of a run.

``EnforceConfig`` holds every knob of ``--enforce`` (docs/contracts.md, "Enforcement"); it is
passed from the spec and command line through ``train_run`` to ``plan`` and the ``Enforcer``.
A ``ClauseLever`` is the set of objectives (``headwise.control.Objective`` loss terms) that one
clause's multiplier weights; ``RunStructure`` is what planning reads of a run besides its
model (task names, structural masks, fixed gates, the tasks' known circuits), and
``PlanContext`` what a kind's ``lever`` builds on, collecting the objectives it adds.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import Enum
from functools import cached_property
from statistics import NormalDist
from typing import TYPE_CHECKING, Any, Protocol

import torch
from torch import nn

from headwise.control.objectives import Desaturation, Objective
from headwise.control.task_levers import OnProbeData
from headwise.data import Batch
from headwise.errors import field_error
from headwise.heads import Head, HeadSet

if TYPE_CHECKING:
    from headwise.contract.clause import Contract

ProbeSampler = Callable[[str, int, int], Batch]
"""``fn(name, n, seed) -> Batch``: ``n`` examples drawn like a named probe, or ``n`` training
examples of a task of that name (the pipeline passes
``headwise.pipeline.heldout.probe_sampler(spec, data)``)."""

STOPS = ("end", "first_hold")  # EnforceConfig.stop
POINTS = 30  # enforcement points in a budget, unless EnforceConfig.every says otherwise
MIN_EVERY = 10  # the fewest steps between them, unless the evaluation points are closer
# The lever of "H carries T": one stage of parts, or "others" then "margin" (see EnforceConfig).
CARRIER_STAGES = ((("others",), ("margin",)), (("others", "margin"),), (("others",),),
                  (("margin",),))


@dataclass(frozen=True)
class DualContext:
    """What a dual update reads at an evaluation point besides the multipliers.

    Attributes:
        levers: each clause's lever by index (``None``: no lever).
        failing: the tasks whose floor fails on the enforcement set now.
        floors: the indices of task-floor clauses (``ClauseKind.guards_task``).
        eta: the dual step per unit of violation.
        lambda_max: the cap on every multiplier.
        rates: the dual step per unit of violation of the clauses whose step is not ``eta``
            (those whose multipliers also move between evaluation points: their violations
            come in their own units, ``ClauseLever.unit``, and weigh as much as the batches
            since the last evaluation point; ``headwise.contract.between``).
        share: the steps since the previous enforcement point over ``train.eval_every``: a
            setting counted per evaluation point (``eta``, the floor rule's halving) acts in
            that proportion at an enforcement point, so the cadence
            (``EnforceConfig.cadence``) does not change how fast multipliers move per step.
    """

    levers: Mapping[int, ClauseLever | None]
    failing: frozenset[str | None]
    floors: frozenset[int]
    eta: float
    lambda_max: float
    rates: Mapping[int, float] = field(default_factory=dict)
    share: float = 1.0


class DualUpdate(Protocol):
    """How the multipliers move at an evaluation point (``EnforceConfig.dual``, set by code;
    specs keep the default).

    ``update`` changes ``lambdas`` (by clause index) in place from ``violations`` (each levered
    clause's signed violation aimed past its guard). ``keeps_held_model``: whether the run keeps
    the model of the last evaluation point at which the contract held (else its final one).
    """

    @property
    def keeps_held_model(self) -> bool: ...

    def update(self, lambdas: dict[int, float], violations: Mapping[int, float],
               ctx: DualContext) -> None: ...


@dataclass(frozen=True)
class ProjectedAscent:
    """The default dual update: projected dual ascent after the floor rule.

    First the multiplier of each lever that degrades a task whose floor fails
    (``ClauseLever.perturbs``: an ablation lever on that task's examples) is halved per
    evaluation interval (by ``0.5 ** share``); every other lever, a role objective building the
    task's circuit among them, keeps its own. Then ``lambda_c <- clip(lambda_c + eta share v_c,
    0, lambda_max)`` for each levered clause ``c`` (``eta share``: ``DualContext.rates[c]``
    where given, already in steps).
    """

    keeps_held_model: bool = True

    def update(self, lambdas: dict[int, float], violations: Mapping[int, float],
               ctx: DualContext) -> None:
        for index, lever in ctx.levers.items():
            if lever is not None and index in lambdas and lever.perturbs & ctx.failing:
                lambdas[index] *= 0.5 ** ctx.share
        for index, v in violations.items():
            lam = float(lambdas.get(index, 0.0))
            eta = ctx.rates.get(index, ctx.eta * ctx.share)
            lambdas[index] = min(max(lam + eta * v, 0.0), ctx.lambda_max)


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
        dual: how the multipliers move at evaluation points (a ``DualUpdate``; default
            ``ProjectedAscent``). Set by code only: a spec's ``enforce:`` keeps the default.
        eta_batch: the dual step per training step, per unit of violation in the clause's
            own units (``ClauseLever.unit``: the room its bound leaves), for a clause whose
            lever measures it on every training batch (a score clause's pattern objective or
            row-wise bound, a preserve clause's distillation: ``headwise.contract.between``).
            Its multiplier steps on each batch's value, and at an evaluation point on the
            enforcement set's, weighed as the batches since the last one. 0.1 = ``1 -
            beta1`` of AdamW's default: a clause one room short moves its multiplier by 1 (its
            lever as strong as the task's loss) in the ten steps AdamW's momentum averages
            over. 0: only at evaluation points, by ``eta``.
        pace_max: the largest factor enforcement may put on the run's peak learning rate.
            AdamW moves a parameter by about the learning rate per step however large the
            loss's weight, so a multiplier at ``lambda_max`` cannot move a clause faster; at
            an evaluation point at which a levered clause fails with its multiplier at
            ``lambda_max``, the factor (the *pace*) doubles, up to ``pace_max``; it halves for
            good where that clause's violation rose at a pace above 1, and halves while a task
            floor fails or where the contract holds, down to 1 (``Enforcer._pace``). While
            it is above 1 the learning rate is the pace times the peak rate ``train.lr``
            (the schedule's warm-up and decay suspended: a decaying rate slows a lagging
            clause most near the end); at 1 the schedule resumes. 1: never.
        every: the steps between enforcement points, where the contract is measured on the
            enforcement set, the multipliers and the pace step and the kept model is chosen;
            ``None`` (the default): ``cadence``, often enough for ``POINTS`` points in the
            budget (not closer than ``MIN_EVERY`` steps) and never sparser than the run's
            evaluation points, so that a contract
            evaluated every 50 steps in a 300-step run is not enforced six times only.
        confidence: how sure enforcement must be that a clause holding on the enforcement set
            holds on an independent set of the same size too (one-sided, normal
            approximation): a multiplier keeps rising until its clause holds with a margin of
            ``guard`` standard errors of its measurement, and the kept model is the last one
            at which every clause did (else the last at which the contract held). 0.5: the
            bare bound.

        retries: how many times a run whose kept model is not certified on the enforcement
            set at the end of its budget trains again, from its initial weights at half the
            previous attempt's learning rate; the run keeps the attempt whose kept model
            reached the highest tier there (``headwise.contract.retry``). 0: never.

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
    dual: DualUpdate = field(default_factory=ProjectedAscent)
    eta_batch: float = 0.1
    pace_max: float = 8.0
    every: int | None = None
    retries: int = 1

    def __post_init__(self) -> None:
        if isinstance(self.retries, bool) or not isinstance(self.retries, int) \
                or self.retries < 0:
            raise field_error("retries", self.retries, "an integer >= 0")
        if self.every is not None and (isinstance(self.every, bool)
                                       or not isinstance(self.every, int) or self.every < 1):
            raise field_error("every", self.every, "an integer >= 1 (steps), or null")
        if isinstance(self.pace_max, bool) or not isinstance(
                self.pace_max, (int, float)) or not self.pace_max >= 1:
            raise field_error("pace_max", self.pace_max, "a number >= 1")
        if isinstance(self.eta_batch, bool) or not isinstance(
                self.eta_batch, (int, float)) or not self.eta_batch >= 0:
            raise field_error("eta_batch", self.eta_batch, "a number >= 0")
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

    def cadence(self, steps: int, eval_every: int) -> int:
        """The steps between enforcement points in a run of ``steps`` updates evaluated every
        ``eval_every`` (0: never): ``every`` when set; else ``steps // POINTS``, but not under
        ``MIN_EVERY``, or ``eval_every`` where that is denser. ``POINTS`` points leave the
        pace's doublings (three to ``pace_max``) and a halving within the first tenth of the
        budget, and the kept model a choice among as many points; closer than ``MIN_EVERY``
        steps (AdamW's momentum horizon, ``1 / (1 - beta1)``) a point would see the same
        update direction as the last."""
        if self.every is not None:
            return self.every
        own = max(MIN_EVERY, steps // POINTS)
        return min(own, eval_every) if eval_every else own

    @property
    def staged_from(self) -> float:
        """The multiplier from which a second carrier stage acts (first stage saturated)."""
        return self.p_max / self.ablation_scale


@dataclass(frozen=True)
class RunStructure:
    """What planning reads of a run besides its model and contract.

    Attributes:
        task_names: the tasks in task-id order.
        masks: each structurally masked head and its mask's name.
        gated_off: per task, the heads fixed task gates switch off on its examples (their
            output is zero there); empty without fixed gates (learned gates may open).
        circuits: per task, the circuit its generator declares (``(role, layer)`` pairs:
            ``headwise.data.Task.circuit``), else the one proposed from its training examples
            (``headwise.data.circuit_proposals``): a floor's circuit assists, and the roles a
            path clause on the task implies.
    """

    task_names: tuple[str, ...]
    masks: Mapping[Head, str] = field(default_factory=dict)
    gated_off: Mapping[str, frozenset[Head]] = field(default_factory=dict)
    circuits: Mapping[str, tuple[tuple[str, int], ...]] = field(default_factory=dict)


class LeverKind(str, Enum):
    """What a clause's lever acts through (``ClauseLever.kind``)."""

    PATTERN = "pattern"  # pattern objectives towards a role's target
    BOUND = "bound"  # a mass penalty keeping a role score under a cap
    ABLATION = "ablation"  # stochastic ablation of heads (and the carrier's hinge)
    TASK_WEIGHT = "task_weight"  # extra loss weight on a task (a task floor)
    DISTILL = "distill"  # distillation to the starting model (preserve clauses)
    STRUCTURAL = "structural"  # nothing to train: the run's structure decides the clause


@dataclass(frozen=True)
class Follows:
    """An assist that is one of several heads an ``any_of`` score clause may drive for the
    same role: it pulls only while that clause drives its head, so the assist and the clause
    build the role on one head, not on two. Until the clause has chosen one of ``options``
    (or where it chose a head outside them), the first of ``options`` pulls.

    Attributes:
        clause: the ``any_of`` clause's index (``EnforcementRecord.chosen`` is keyed by it).
        head: this assist's head, ``L1.H0``.
        options: the heads of the assist's layer the clause may drive, first the default.
    """

    clause: int
    head: str
    options: tuple[str, ...]

    def pulls(self, chosen: Mapping[int, str]) -> bool:
        """Whether this assist's head is the one to pull, given the heads chosen so far."""
        pick = chosen.get(self.clause)
        return self.head == (pick if pick in self.options else self.options[0])


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
    circuit assists); ``follows``: per assist's name, where the head it pulls is the choice
    of an ``any_of`` clause (``Follows``). ``desaturation``: an idle entropy floor
    (``Desaturation``) the enforcer switches on, at the same weight as the assists, where a
    task floor fails, its task has learned nothing from its input and one of its heads is
    saturated where the answers are read, and off once the task has learned
    (``Enforcer._desaturate``).
    ``perturbs``: the tasks whose examples the lever degrades
    (an ablation lever ablates heads on them), so it backs off while a floor on one of them
    fails (``Enforcer.dual_step``). ``unit``: set by ``plan`` for a lever whose objectives
    measure its clause on every training batch (``batch_values``): the room the clause's bound
    leaves in its range (``room``), in which its violations are read; its multiplier then also
    moves between evaluation points (``headwise.contract.between``). ``start``: the weight the
    lever holds from the first step whatever its multiplier (``plan`` sets its objectives to
    it), for a lever that decides which route the model learns and must act before the model
    commits to another one (a circuit's outside ablated: docs/contracts.md, "Circuit
    clause"); 0: the multiplier alone weighs it.
    """

    kind: LeverKind
    description: str
    objectives: list[Objective] = field(default_factory=list)
    scale: float = 1.0
    cap: float | None = None
    per_head: dict[str, list[Objective]] = field(default_factory=dict)
    loss_terms: list[Objective] = field(default_factory=list)
    loss_from: float = 0.0
    assists: list[Objective] = field(default_factory=list)
    follows: dict[str, Follows] = field(default_factory=dict)
    desaturation: list[Desaturation] = field(default_factory=list)
    perturbs: frozenset[str] = frozenset()
    unit: float | None = None
    start: float = 0.0


@dataclass
class PlanContext:
    """What a clause kind's ``lever`` builds on: the model, the contract and the run's
    structure, probe sampling, settings; ``objectives`` collects what the levers add."""

    model: nn.Module
    contract: Contract
    structure: RunStructure
    config: EnforceConfig
    probes: ProbeSampler | None = None
    data: Any = None  # the enforcement set (VerifyData), for checks that read a probe's shape
    objectives: list[Objective] = field(default_factory=list)

    @property
    def n_layers(self) -> int:
        return self.contract.n_layers

    @property
    def n_heads(self) -> int:
        return self.contract.n_heads

    @property
    def task_names(self) -> tuple[str, ...]:
        return self.structure.task_names

    @property
    def named(self) -> frozenset[Head]:
        """Heads some clause of the contract names."""
        return self.contract.named_heads

    def heads(self, heads: Head | Sequence[Head]) -> HeadSet:
        items = [heads] if isinstance(heads, Head) else list(heads)
        return HeadSet(items, self.n_layers, self.n_heads)

    @cached_property
    def fixed(self) -> frozenset[Head]:
        """Heads whose pattern a structural mask fixes: it leaves every query at most one key
        (with causality), so no weight moves where the head attends and a lever on its pattern
        has nothing to drive. A mask that leaves several keys (``causal``, ``local``,
        ``block_diagonal``, a matrix) only narrows the pattern: such a head keeps its levers,
        and ``check_possible`` refuses a bound the mask puts out of reach."""
        if not self.masks:
            return frozenset()
        model: Any = self.model
        T = int(model.config.max_seq_len)
        device = next(model.parameters()).device
        keys = {}
        for layer in sorted({h.layer for h in self.masks}):
            allowed = model.blocks[layer].attn.head_mask(T, None, device)  # (H|1, T, T)
            if bool(model.config.causal):
                allowed = allowed & torch.ones(T, T, dtype=torch.bool, device=device).tril()
            keys[layer] = allowed.sum(-1).amax(-1)  # the most keys any query has, per head
        return frozenset(h for h in self.masks
                         if int(keys[h.layer][h.head if keys[h.layer].numel() > 1 else 0]) <= 1)

    @property
    def masks(self) -> Mapping[Head, str]:
        """Each structurally masked head and its mask's name."""
        return self.structure.masks

    def gated_off(self, task: str) -> frozenset[Head]:
        """Heads that fixed task gates switch off on ``task``'s examples (their output is
        zero there, so ablating them changes nothing)."""
        return self.structure.gated_off.get(task, frozenset())

    def add(self, obj: Any, name: str) -> Any:
        """Add a lever objective to the plan at weight 0 (names are unique: checkpoints store
        lever weights by name)."""
        obj.name = name
        obj.weight = 0.0
        self.objectives.append(obj)
        return obj

    def on_probe(self, obj: Any, name: str, clause: Any) -> Any:
        """``obj`` trained on batches drawn like the clause's probe: none or ``default``, on
        the training batches; a task's name, on that task's rows of them (``on_task``);
        another probe, on batches its generator draws (``OnProbeData``).

        Raises:
            ValueError: the clause reads a probe and no ``probes`` sampler was given.
        """
        obj.name = name
        probe = clause.on
        if probe is None or probe == "default":
            return obj
        if probe in self.task_names:
            return self.on_task(obj, probe)
        if self.probes is None:
            raise ValueError(f"plan: {clause.path} is measured on probe {probe!r}; pass "
                             "probes= (headwise.pipeline.heldout.probe_sampler)")
        sample = self.probes
        return OnProbeData(self.model, obj, lambda n, seed: sample(probe, n, seed))

    def on_task(self, obj: Any, task: str) -> Any:
        """``obj`` (a pattern or distillation lever) trained on ``task``'s rows of each
        training batch only, as its clause is measured on that task's examples: a lever for
        one task's clause or circuit leaves the other tasks' rows alone. In a run of that one
        task every row is the task's, and nothing is restricted."""
        if self._restricts(task):
            obj.task_id = list(self.task_names).index(task)
        return obj

    def _restricts(self, task: str | None) -> bool:
        """Whether a lever for ``task`` reads only some rows: the run has other tasks too."""
        return task in self.task_names and len(self.task_names) > 1

    def task_sampler(self, task: str) -> Callable[[int, int], Batch] | None:
        """``fn(n, seed)``: ``n`` training examples of ``task`` (``None`` without a sampler):
        the pool a path lever takes its clean means from."""
        if self.probes is None:
            return None
        sample = self.probes
        return lambda n, seed: sample(task, n, seed)

    def reads_probe(self, clause: Any) -> bool:
        """Whether the clause's lever trains on probe-like batches (see ``on_probe``)."""
        return not (clause.on is None or clause.on == "default"
                    or clause.on in self.task_names)

    def data_words(self, clause: Any) -> str:
        """What ``on_probe`` trains the clause's lever on, for its description: `` on
        P-like batches``, `` on T's rows``, or nothing for the training batches."""
        if self.reads_probe(clause):
            return f" on {clause.on}-like batches"
        return f" on {clause.on}'s rows" if self._restricts(clause.on) else ""

def names(heads: Any) -> str:
    """``L0.H1,L1.H2``."""
    return ",".join(str(h) for h in heads)


ROLE_RANGE = (0.0, 1.0)  # every role score (headwise.patterns)


def room(clause: Any, lever: ClauseLever) -> float | None:
    """The room a clause's bound leaves in the range of its value: ``high - at_least`` or
    ``at_most - low`` (the smaller of the two for a clause bounded on both sides); ``None``
    where it is not finite and positive (a bound at the end of its range, or an unbounded
    range). A role score's range is [0, 1] (a pattern or bound lever's clause).

    E.g. a previous-token score ``>= 0.8``: 0.2; an embedding cosine ``>= 0.99``: 0.01; a role
    drift ``<= 0.05``: 0.05. A violation divided by it is in the clause's own units: 1 is
    "short by as much as the bound leaves", for roles, cosines and drifts alike.
    """
    low, high = clause.entry.value_range(clause)
    if lever.kind in (LeverKind.PATTERN, LeverKind.BOUND):
        low, high = ROLE_RANGE
    sides = [high - clause.at_least if clause.at_least is not None else math.inf,
             clause.at_most - low if clause.at_most is not None else math.inf]
    value = min(sides)
    return value if math.isfinite(value) and value > 0 else None
