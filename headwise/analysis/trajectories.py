"""Role trajectories over training checkpoints: every role at every checkpoint, commitment steps.

Each checkpoint is scored by the same function that builds the run's role table (for a run:
``headwise.pipeline.run_analysis.run_role_table``, induction on the ``repeated`` probe included), so
the last point of a trajectory *is* the role table. A head's *top role* at a checkpoint is
``RoleTable.top_role`` with the table's shown threshold (``SHOWN_MIN_SCORE``: ``"none"`` below
it); its *commitment step* is the first checkpoint step from which its top role never changes
again. Forecasts of final roles from early checkpoints live in ``headwise.forecast.roles``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import torch
from torch import nn

from headwise.analysis.role_table import SHOWN_MIN_SCORE, RoleTable
from headwise.heads import Head


class Trajectory:
    """Scores of heads over checkpoints.

    Args:
        tables: ``(step, RoleTable)`` pairs, any order (sorted by step); every table must score
            the same heads. Roles missing from some table are dropped.

    Raises:
        ValueError: no tables, or tables over different heads.
    """

    def __init__(self, tables: Sequence[tuple[int, RoleTable]]) -> None:
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
        return Trajectory(list(zip(self.steps[:n], self.tables[:n], strict=True)))

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
        return {"steps": self.steps, "roles": self.roles, "min_score": min_score, "heads": heads}

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
        return cls(tables)


def _num(v: float) -> float | None:
    return None if math.isnan(v) else v


def score_checkpoints(checkpoints: Iterable[tuple[int, nn.Module]],
                      score: Callable[[nn.Module], RoleTable]) -> Trajectory:
    """Score every ``(step, model)`` with ``score`` (for a run: the role-table function)."""
    return Trajectory([(step, score(model)) for step, model in checkpoints])
