"""What enforcement records as it trains: typed, and JSON only where it meets a checkpoint.

The ``Enforcer`` keeps an ``EnforcementRecord``: every evaluation point's measurements
(``EvalPoint``), each levered clause's multiplier, the head an ``any_of`` clause's lever drives,
each clause's track (``ClauseTrack``: when it first failed, from when it holds, its best value),
when a floor's circuit assists switched on, and the kept model's step. Checkpoints carry it in
the trainer's callback state as JSON (``TrainState.extra["enforce"]``), so a resumed run
continues exactly: ``to_dict`` / ``from_dict`` are the one place the two forms meet (clause
indices become string keys there, as JSON objects need).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

ENTRY = "enforce"  # the record's entry in TrainState.extra

# What a kept point was (``EnforcementRecord.kept_as``), weakest first.
KEPT_TIERS = ("held", "past every guard", "certified")


@dataclass
class PointValues:
    """One clause at one evaluation point (enforcement set).

    Attributes:
        measured: its measured value (``None``: nothing could be measured).
        stderr: the measurement's standard error.
        violation: the signed violation (``> 0``: fails by that much).
        aimed: the violation aimed past the bound by the guard (what the multiplier reads).
        multiplier: the multiplier after this point's update (``None``: no lever).
        passed: whether it held.
        saturated: whether its lever was at its limit.
    """

    measured: float | None
    stderr: float | None
    violation: float
    aimed: float
    multiplier: float | None
    passed: bool
    saturated: bool

    def to_dict(self) -> dict[str, Any]:
        return {"measured": self.measured, "stderr": self.stderr, "violation": self.violation,
                "aimed": self.aimed, "multiplier": self.multiplier, "passed": self.passed,
                "saturated": self.saturated}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> PointValues:
        return cls(d["measured"], d["stderr"], d["violation"], d["aimed"], d["multiplier"],
                   d["passed"], d["saturated"])


@dataclass
class EvalPoint:
    """One evaluation point: the step, whether the contract held, whether every clause held
    past its guard (``confident``), each clause's values by index, and whether the contract
    was certified there (every clause's confidence bound past its threshold at the contract's
    family-wise level; measured only where it held), and the pace after it (the factor on the
    learning rate, ``EnforceConfig.pace_max``)."""

    step: int
    passed: bool
    confident: bool
    clauses: dict[int, PointValues] = field(default_factory=dict)
    certified: bool = False
    pace: float = 1.0  # the factor on the learning rate from this point on

    def to_dict(self) -> dict[str, Any]:
        return {"step": self.step, "passed": self.passed, "confident": self.confident,
                "certified": self.certified, "pace": self.pace,
                "clauses": {str(i): v.to_dict() for i, v in self.clauses.items()}}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> EvalPoint:
        return cls(d["step"], d["passed"], d.get("confident", False),
                   {int(k): PointValues.from_dict(v) for k, v in d["clauses"].items()},
                   d.get("certified", False), float(d.get("pace", 1.0)))


@dataclass
class ClauseTrack:
    """A clause over the whole run: its lever, when it first failed and how often, the step
    from which it holds (``None``: it fails now), and its best value so far."""

    index: int
    description: str
    lever: str | None
    lever_objectives: list[str]
    assists: list[str]
    first_failed_at: int | None = None
    failed_evals: int = 0
    held_at: int | None = None
    best: dict[str, Any] | None = None  # {"step", "violation", "value"}

    def to_dict(self) -> dict[str, Any]:
        return {"index": self.index, "description": self.description, "lever": self.lever,
                "lever_objectives": list(self.lever_objectives), "assists": list(self.assists),
                "first_failed_at": self.first_failed_at, "failed_evals": self.failed_evals,
                "held_at": self.held_at, "best": self.best}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> ClauseTrack:
        return cls(d["index"], d["description"], d["lever"], list(d["lever_objectives"]),
                   list(d["assists"]), d["first_failed_at"], d["failed_evals"], d["held_at"],
                   d["best"])


@dataclass
class EnforcementRecord:
    """Everything enforcement has decided and measured so far (see the module docstring).

    Attributes:
        history: every evaluation point, in order.
        multipliers: each levered clause's multiplier, by clause index.
        chosen: the head whose lever an ``any_of`` clause drives, by clause index.
        clauses: each clause's track, by clause index.
        assisted: the step at which each floor's circuit assists switched on.
        desaturated: per floor whose desaturation switched on, ``[on, off]``: the step it
            switched on and the step it switched off (``None`` while on).
        held_at: the first step at which the whole contract held.
        kept_step: the step whose weights the run keeps (``None``: none yet).
        kept_sha256: the kept weights file's digest (with a run directory).
        kept_as: what the kept point was, one of ``KEPT_TIERS``: ``"certified"`` (the
            contract certified on the enforcement set), ``"past every guard"`` or ``"held"``.
        pace_ceiling: the highest pace allowed from now on, once a faster one overshot
            (``None``: ``EnforceConfig.pace_max``).
    """

    history: list[EvalPoint] = field(default_factory=list)
    multipliers: dict[int, float] = field(default_factory=dict)
    chosen: dict[int, str] = field(default_factory=dict)
    clauses: dict[int, ClauseTrack] = field(default_factory=dict)
    assisted: dict[int, int] = field(default_factory=dict)
    desaturated: dict[int, list[int | None]] = field(default_factory=dict)
    held_at: int | None = None
    kept_step: int | None = None
    kept_sha256: str | None = None
    kept_as: str | None = None
    pace_ceiling: float | None = None

    def to_dict(self) -> dict[str, Any]:
        """The JSON form checkpoints carry (``TrainState.extra["enforce"]``)."""
        out: dict[str, Any] = {
            "history": [p.to_dict() for p in self.history],
            "multipliers": {str(i): v for i, v in self.multipliers.items()},
            "chosen": {str(i): h for i, h in self.chosen.items()},
            "clauses": {str(i): t.to_dict() for i, t in self.clauses.items()},
            "assisted": {str(i): s for i, s in self.assisted.items()},
            "desaturated": {str(i): list(span) for i, span in self.desaturated.items()}}
        for name in ("held_at", "kept_step", "kept_sha256", "kept_as", "pace_ceiling"):
            if getattr(self, name) is not None:
                out[name] = getattr(self, name)
        return out

    @classmethod
    def from_dict(cls, d: dict[str, Any] | None) -> EnforcementRecord:
        """The record of ``to_dict``'s form (``None``: a run not yet evaluated)."""
        if not d:
            return cls()
        return cls([EvalPoint.from_dict(p) for p in d.get("history", [])],
                   {int(k): float(v) for k, v in d.get("multipliers", {}).items()},
                   {int(k): str(v) for k, v in d.get("chosen", {}).items()},
                   {int(k): ClauseTrack.from_dict(v) for k, v in d.get("clauses", {}).items()},
                   {int(k): int(v) for k, v in d.get("assisted", {}).items()},
                   {int(k): [int(v[0]), None if v[1] is None else int(v[1])]
                    for k, v in d.get("desaturated", {}).items()},
                   d.get("held_at"), d.get("kept_step"), d.get("kept_sha256"),
                   d.get("kept_as"), d.get("pace_ceiling"))

    @classmethod
    def of(cls, extra: dict[str, Any]) -> EnforcementRecord:
        """The record in a trainer's callback state (empty when enforcement never ran)."""
        return cls.from_dict(extra.get(ENTRY))
