"""Role trajectories over training checkpoints: every role at every checkpoint, commitment steps.

Each checkpoint is scored by the same function that builds the run's role table (for a run:
``headwise.pipeline.analyze.run_role_table``, induction on the ``repeated`` probe included), so
the last point of a trajectory *is* the role table. A head's *top role* at a checkpoint is
``RoleTable.top_role`` with the table's shown threshold (``SHOWN_MIN_SCORE``: ``"none"`` below
it); its *commitment step* is the first checkpoint step from which its top role never changes
again. Forecasts of final roles from early checkpoints live in ``headwise.analysis.forecast``.

A trajectory may also carry per-checkpoint training ``Signals`` (the loss on a held-out batch and
each head's gradient alignment with each top-role candidate, computed by
``headwise.analysis.forecast_signals``); the forecast benchmark scores them as candidate
features.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

from headwise.analysis.role_table import SHOWN_MIN_SCORE, TOP_ROLE_CANDIDATES, RoleTable
from headwise.heads import Head


@dataclass(frozen=True)
class Signals:
    """Training signals at one checkpoint: ``loss`` (the training loss on a held-out batch) and
    ``alignment`` and ``param_alignment`` (N, len(TOP_ROLE_CANDIDATES)), each head's gradient
    alignment with each role in pattern and in parameter space
    (``headwise.analysis.forecast_signals``; NaN where undefined), heads in the table's order."""

    loss: float
    alignment: Tensor
    param_alignment: Tensor


class Trajectory:
    """Scores of heads over checkpoints.

    Args:
        tables: ``(step, RoleTable)`` pairs, any order (sorted by step); every table must score
            the same heads. Roles missing from some table are dropped.
        signals: ``{step: Signals}``; kept (as ``loss`` (C,), ``alignment`` and
            ``param_alignment`` (C, N, len(TOP_ROLE_CANDIDATES))) only when every checkpoint
            has them, else all three are ``None``.

    Raises:
        ValueError: no tables, tables over different heads, or signals of another shape.
    """

    def __init__(self, tables: Sequence[tuple[int, RoleTable]],
                 signals: Mapping[int, Signals] | None = None) -> None:
        if not tables:
            raise ValueError("tables: got an empty list, expected (step, RoleTable) pairs")
        tables = sorted(tables, key=lambda p: p[0])
        self.steps = [int(s) for s, _ in tables]
        self.heads: list[Head] = list(tables[0][1].heads)
        self.roles = [r for r in tables[0][1].roles if all(r in t.roles for _, t in tables)]
        for step, t in tables:
            if set(t.heads) != set(self.heads):
                raise ValueError(f"tables: checkpoint {step} scores heads "
                                 f"{[str(h) for h in t.heads]}, expected the same heads as step "
                                 f"{self.steps[0]}")
        self.tables = [t for _, t in tables]
        self.values = torch.tensor([[[t.get(h, r) for r in self.roles] for h in self.heads]
                                    for t in self.tables], dtype=torch.float64)  # (C, N, R)
        self.signals = ({s: signals[s] for s in self.steps}
                        if signals and all(s in signals for s in self.steps) else None)
        self.loss: Tensor | None = None
        self.alignment: Tensor | None = None
        self.param_alignment: Tensor | None = None
        if self.signals is not None:
            sig = [self.signals[s] for s in self.steps]
            shape = (len(self.heads), len(TOP_ROLE_CANDIDATES))
            for step, x in zip(self.steps, sig, strict=True):
                if x.alignment.shape != shape or x.param_alignment.shape != shape:
                    raise ValueError(f"signals: checkpoint {step} has alignments of shape "
                                     f"{tuple(x.alignment.shape)}, "
                                     f"{tuple(x.param_alignment.shape)}, expected {shape}")
            self.loss = torch.tensor([x.loss for x in sig], dtype=torch.float64)  # (C,)
            self.alignment = torch.stack([x.alignment.double() for x in sig])  # (C, N, R)
            self.param_alignment = torch.stack([x.param_alignment.double() for x in sig])

    def scores(self, head: Head | str, role: str) -> list[float]:
        """One head's score for ``role`` at every checkpoint."""
        return [t.get(head, role) for t in self.tables]

    def top_roles(self, head: Head | str, min_score: float = SHOWN_MIN_SCORE) -> list[str]:
        """The head's top role at every checkpoint."""
        return [t.top_role(head, min_score) for t in self.tables]

    def final_role(self, head: Head | str, min_score: float = SHOWN_MIN_SCORE) -> str:
        """The head's top role at the last checkpoint (its role table's top role)."""
        return self.tables[-1].top_role(head, min_score)

    def commitment_step(self, head: Head | str, min_score: float = SHOWN_MIN_SCORE) -> int:
        """First step from which the top role stays equal to the final role."""
        roles = self.top_roles(head, min_score)
        i = len(roles) - 1
        while i > 0 and roles[i - 1] == roles[-1]:
            i -= 1
        return self.steps[i]

    def upto(self, n: int) -> Trajectory:
        """The first ``n`` checkpoints (at least one)."""
        n = max(1, min(n, len(self.steps)))
        return Trajectory(list(zip(self.steps[:n], self.tables[:n], strict=True)), self.signals)

    def to_dict(self, min_score: float = SHOWN_MIN_SCORE) -> dict[str, Any]:
        """JSON-ready summary: per-head scores over steps, top roles and commitment."""
        heads = []
        for i, h in enumerate(self.heads):
            heads.append({
                "layer": h.layer, "head": h.head,
                "scores": {r: [_num(float(v)) for v in self.values[:, i, j]]
                           for j, r in enumerate(self.roles)},
                "top_roles": self.top_roles(h, min_score),
                "final_role": self.final_role(h, min_score),
                "commitment_step": self.commitment_step(h, min_score),
            })
            for key in ("alignment", "param_alignment"):
                series = getattr(self, key)
                if series is not None:
                    heads[-1][key] = {r: [_num(float(v)) for v in series[:, i, j]]
                                      for j, r in enumerate(TOP_ROLE_CANDIDATES)}
        out = {"steps": self.steps, "roles": self.roles, "min_score": min_score, "heads": heads}
        if self.loss is not None:
            out["loss"] = [float(v) for v in self.loss]
        return out

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Trajectory:
        """Inverse of ``to_dict`` (scores only; ``None`` back to NaN)."""
        tables = []
        heads = [Head(int(h["layer"]), int(h["head"])) for h in d["heads"]]
        for c, step in enumerate(d["steps"]):
            vals = torch.tensor([[math.nan if h["scores"][r][c] is None else h["scores"][r][c]
                                  for r in d["roles"]] for h in d["heads"]], dtype=torch.float64)
            tables.append((int(step), RoleTable(heads, d["roles"],
                                                vals.reshape(len(heads), len(d["roles"])))))
        return cls(tables, _signals_from_dict(d))


def _num(v: float) -> float | None:
    return None if math.isnan(v) else v


def _signals_from_dict(d: dict[str, Any]) -> dict[int, Signals] | None:
    """The ``Signals`` of a ``to_dict`` summary (``None`` when it has none)."""
    keys = ("alignment", "param_alignment")
    if "loss" not in d or not all(k in h for h in d["heads"] for k in keys):
        return None

    def table(key: str, c: int) -> Tensor:
        return torch.tensor([[math.nan if h[key][r][c] is None else h[key][r][c]
                              for r in TOP_ROLE_CANDIDATES] for h in d["heads"]],
                            dtype=torch.float64)

    return {int(step): Signals(float(d["loss"][c]), table(keys[0], c), table(keys[1], c))
            for c, step in enumerate(d["steps"])}


def score_checkpoints(checkpoints: Iterable[tuple[int, nn.Module]],
                      score: Callable[[nn.Module], RoleTable],
                      signals: Callable[[nn.Module], Signals] | None = None) -> Trajectory:
    """Score every ``(step, model)`` with ``score`` (for a run: the role-table function) and,
    given ``signals``, record its training signals (``forecast_signals.gradient_signals``)."""
    tables, sig = [], {}
    for step, model in checkpoints:
        tables.append((step, score(model)))
        if signals is not None:
            sig[step] = signals(model)
    return Trajectory(tables, sig or None)
