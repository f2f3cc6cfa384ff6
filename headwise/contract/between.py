"""Multipliers that move between evaluation points, on each training batch's own measurement.

At evaluation points the enforcer measures every clause on the enforcement set; with evaluation
every 50 steps that is six dual steps in a 300-step run, and nothing constrains the steps before
the first. Some levers measure their clause on every training batch anyway (``batch_values``):
a score clause's pattern objective or row-wise bound sees its heads' patterns (their role score
on the batch), a preserve clause's distillation sees the trained and the starting model's
outputs (the cosine or the KL on the batch; for a role drift, every free head's role
scores). For those clauses (``tracked``) ``BatchDual``, an objective run after the levers in
every training step, takes a dual step per batch::

    lambda_c <- clip(lambda_c + eta_batch * v_c / u_c, 0, lambda_max)

with ``v_c`` the clause's signed violation on the batch (``> 0``: fails by that much) and
``u_c`` its room (``headwise.contract.lever.room``: what its bound leaves of its range), so one
``eta_batch`` fits role scores, cosines and drifts. The levers are weighed in the same units: a
lever's loss for a clause on its bound is 1 at multiplier 1 (``weigh_in_units``; the
distillation levers' scales in ``headwise.contract.preserve``). At an evaluation point the
enforcer steps the same multiplier on the enforcement set's violation (aimed past the bound by
the guard), weighed as the batches since the last evaluation point: the measurement on held-out
data corrects as much as those batches moved it.

The multiplier of a tracked clause lives in its lever's weights (``weight = lambda * scale``),
which checkpoints store and ``--resume`` restores, so a resumed run takes the same steps; the
step reads the batch values to the host once per step (one read for every tracked clause;
under ``torchrun`` averaged over the ranks first, so every rank takes the same step).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Protocol, cast, runtime_checkable

import torch
import torch.distributed as dist
from torch import Tensor, nn

from headwise.contract.clause import Clause
from headwise.contract.lever import ClauseLever, EnforceConfig, LeverKind, room
from headwise.model.hook_point import Hook

NAME = "enforce:batch-dual"


@runtime_checkable
class Measuring(Protocol):
    """A lever objective that measures its clause's statistic on each batch it trains on."""

    def batch_values(self) -> Tensor | None: ...


@dataclass(frozen=True)
class Tracked:
    """A clause whose multiplier moves on every training batch: its lever and its room."""

    clause: Clause
    lever: ClauseLever
    unit: float

    @property
    def multiplier(self) -> float:
        return held_multiplier(self.lever)

    def set(self, lam: float) -> None:
        for obj in self.lever.objectives:
            obj.weight = lam * self.lever.scale

    def violation(self, value: float) -> float:
        """The signed violation of ``value`` in the clause's own units (``/ unit``)."""
        c = self.clause
        sides = [c.at_least - value if c.at_least is not None else -float("inf"),
                 value - c.at_most if c.at_most is not None else -float("inf")]
        return max(sides) / self.unit

    def batch_value(self) -> Tensor | None:
        """The clause's value on the last batch (0-d): the worst of its objectives' values
        (an ``all_of`` clause is decided by its worst head); ``None`` when one has none."""
        parts = [cast(Measuring, obj).batch_values() for obj in self.lever.objectives]
        present = [p for p in parts if p is not None]
        if len(present) < len(parts):
            return None
        values = torch.cat(present)
        return values.amin() if self.clause.at_least is not None else values.amax()


def held_multiplier(lever: ClauseLever) -> float:
    """The multiplier a tracked lever's weights hold (``weight = lambda * scale``)."""
    return float(lever.objectives[0].weight) / lever.scale


def tracked(clause: Clause, lever: ClauseLever | None, config: EnforceConfig) -> Tracked | None:
    """``clause``'s ``Tracked`` when its lever measures it on every batch and nothing else
    sets its weights: every objective has ``batch_values``, no cap, no staged loss terms, no
    assists, not an ``any_of`` clause (whose driven head is chosen at the first evaluation
    point), a room (``room``) and ``eta_batch > 0``; else ``None``."""
    if lever is None or config.eta_batch <= 0 or not lever.objectives:
        return None
    if lever.cap is not None or lever.loss_terms or lever.assists \
            or clause.quantifier == "any_of" or lever.scale <= 0:
        return None
    if not all(isinstance(o, Measuring) for o in lever.objectives):
        return None
    unit = room(clause, lever)
    return None if unit is None else Tracked(clause, lever, unit)


def weigh_in_units(t: Tracked) -> None:
    """Weigh a tracked pattern lever in its clause's units: ``scale = 1 / -log(b)``, the
    cross-entropy of a head whose every row puts mass ``b`` (the clause's ``at_least``) on the
    role's keys (the least it can be at a score of ``b``, by Jensen), so that at multiplier 1
    a clause on its bound weighs one unit of the task's loss, as a distillation lever does
    (``headwise.contract.preserve``)."""
    b = t.clause.at_least
    if t.lever.kind == LeverKind.PATTERN and b is not None and 0.0 < b < 1.0:
        t.lever.scale = 1.0 / -math.log(b)


class BatchDual:
    """The per-batch dual step (module docstring), as an objective the trainer runs after the
    levers: its term is 0, its logs are the multipliers (averaged over a logging window in
    ``metrics.jsonl``). It steps only in training mode (an evaluation forward measures, and
    moves nothing).

    Args:
        model: the model trained (its ``training`` flag tells a training step).
        clauses: the tracked clauses (``tracked``).
        config: ``eta_batch`` and ``lambda_max``.
    """

    def __init__(self, model: nn.Module, clauses: list[Tracked], config: EnforceConfig) -> None:
        self.name = NAME
        self.weight = 0.0
        self.model = model
        self.clauses = clauses
        self.eta = float(config.eta_batch)
        self.lambda_max = float(config.lambda_max)
        self._keys = [f"{NAME}/{t.clause.path}" for t in clauses]

    def prepare(self, batch: Any, step: int = 0) -> None:
        return None

    def hooks(self) -> list[Hook]:
        return []

    def reset(self) -> None:
        return None

    def loss(self, tokens: Tensor, attention_mask: Tensor | None = None
             ) -> tuple[Tensor, dict[str, Tensor]]:
        """0, and each tracked clause's multiplier (after this batch's step) as a log."""
        if self.model.training:
            self.step(tokens.device)
        lams = torch.tensor([t.multiplier for t in self.clauses], device=tokens.device)
        return torch.zeros((), device=tokens.device), dict(zip(self._keys, lams.unbind(),
                                                              strict=True))

    def step(self, device: torch.device) -> None:
        """One dual step per tracked clause on its value on this batch (a clause without one,
        e.g. a probe lever at weight 0, keeps its multiplier)."""
        nan = torch.full((), float("nan"), device=device)
        values = torch.stack([v if (v := t.batch_value()) is not None else nan
                              for t in self.clauses]).float()
        if dist.is_available() and dist.is_initialized():
            dist.all_reduce(values)
            values /= dist.get_world_size()
        for t, value in zip(self.clauses, values.tolist(), strict=True):  # the one host read
            if value != value:  # NaN: nothing measured on this batch
                continue
            lam = t.multiplier + self.eta * t.violation(value)
            t.set(min(max(lam, 0.0), self.lambda_max))
