"""Role trajectories over training checkpoints: commitment steps and early forecasts of roles.

Given the RoleTable of every saved checkpoint, a head's *top role* at a checkpoint is its best
pattern role (``RoleTable.top_role``; ``"none"`` below ``min_score``). Its *commitment step* is
the first checkpoint step from which its top role never changes again (it equals the final one
at every later checkpoint). The *forecast* fits a straight line to each role's score over the
first ``fraction`` of checkpoints (least squares, at least two points), extrapolates it to the
last step, clips to [0, 1], and predicts the top role from those values; ``forecast_accuracy``
is the share of heads whose predicted role equals their actual final role.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from typing import Any

import torch
from torch import Tensor, nn

from headwise.analysis.role_table import TOP_ROLE_CANDIDATES, RoleTable, _head
from headwise.heads import Head


class Trajectory:
    """Scores of heads over checkpoints.

    Args:
        tables: ``(step, RoleTable)`` pairs, any order (sorted by step); every table must score
            the same heads.

    Raises:
        ValueError: no tables, or tables over different heads.
    """

    def __init__(self, tables: Sequence[tuple[int, RoleTable]]) -> None:
        if not tables:
            raise ValueError("tables: got an empty list, expected (step, RoleTable) pairs")
        tables = sorted(tables, key=lambda p: p[0])
        self.steps = [int(s) for s, _ in tables]
        self.heads: list[Head] = list(tables[0][1].heads)
        roles = [r for r in tables[0][1].roles if all(r in t.roles for _, t in tables)]
        self.roles = roles
        for step, t in tables:
            if set(t.heads) != set(self.heads):
                raise ValueError(f"tables: checkpoint {step} scores heads "
                                 f"{[str(h) for h in t.heads]}, expected the same heads as step "
                                 f"{self.steps[0]}")
        self.tables = [t for _, t in tables]
        self.values = torch.tensor([[[t.get(h, r) for r in roles] for h in self.heads]
                                    for t in self.tables], dtype=torch.float64)  # (C, N, R)

    def scores(self, head: Head | str, role: str) -> list[float]:
        """One head's score for ``role`` at every checkpoint."""
        return [t.get(head, role) for t in self.tables]

    def top_roles(self, head: Head | str, min_score: float = 0.0) -> list[str]:
        """The head's top role at every checkpoint."""
        return [t.top_role(head, min_score) for t in self.tables]

    def final_role(self, head: Head | str, min_score: float = 0.0) -> str:
        """The head's top role at the last checkpoint."""
        return self.tables[-1].top_role(head, min_score)

    def commitment_step(self, head: Head | str, min_score: float = 0.0) -> int:
        """First step from which the top role stays equal to the final role."""
        roles = self.top_roles(head, min_score)
        i = len(roles) - 1
        while i > 0 and roles[i - 1] == roles[-1]:
            i -= 1
        return self.steps[i]

    def forecast(self, head: Head | str, fraction: float = 0.2, min_score: float = 0.0,
                 candidates: Iterable[str] = TOP_ROLE_CANDIDATES) -> str:
        """Predicted final top role from the first ``fraction`` of checkpoints (see module)."""
        if not 0.0 < fraction <= 1.0:
            raise ValueError(f"fraction: got {fraction}, expected a number in (0, 1]")
        n_fit = min(len(self.steps), max(2, math.ceil(fraction * len(self.steps))))
        x = torch.tensor(self.steps[:n_fit], dtype=torch.float64)
        row = self.heads.index(_head(head))
        best, best_role = -math.inf, "none"
        for role in candidates:
            if role not in self.roles:
                continue
            y = self.values[:n_fit, row, self.roles.index(role)]
            ok = ~torch.isnan(y)
            if ok.sum() == 0:
                continue
            pred = float(_extrapolate(x[ok], y[ok], float(self.steps[-1])).clamp(0.0, 1.0))
            if pred > best:
                best, best_role = pred, role
        return best_role if best >= min_score else "none"

    def forecast_accuracy(self, fraction: float = 0.2, min_score: float = 0.0) -> float:
        """Share of heads whose forecast equals their actual final role."""
        hits = [self.forecast(h, fraction, min_score) == self.final_role(h, min_score)
                for h in self.heads]
        return sum(hits) / len(hits)

    def to_dict(self, fraction: float = 0.2, min_score: float = 0.0) -> dict[str, Any]:
        """JSON-ready summary: per-head scores over steps, top roles, commitment and forecast."""
        heads = []
        for i, h in enumerate(self.heads):
            heads.append({
                "layer": h.layer, "head": h.head,
                "scores": {r: [_num(float(v)) for v in self.values[:, i, j]]
                           for j, r in enumerate(self.roles)},
                "top_roles": self.top_roles(h, min_score),
                "final_role": self.final_role(h, min_score),
                "commitment_step": self.commitment_step(h, min_score),
                "forecast": self.forecast(h, fraction, min_score),
            })
        return {"steps": self.steps, "roles": self.roles, "min_score": min_score,
                "forecast_fraction": fraction, "heads": heads,
                "forecast_accuracy": self.forecast_accuracy(fraction, min_score)}


def _extrapolate(x: Tensor, y: Tensor, at: float) -> Tensor:
    """Least-squares line through (x, y) evaluated at ``at`` (a constant if one point)."""
    if x.numel() == 1:
        return y[0]
    xm, ym = x.mean(), y.mean()
    var = ((x - xm) ** 2).sum()
    slope = ((x - xm) * (y - ym)).sum() / var if var > 0 else torch.zeros((), dtype=y.dtype)
    return ym + slope * (at - xm)


def _num(v: float) -> float | None:
    return None if math.isnan(v) else v


def score_checkpoints(checkpoints: Iterable[tuple[int, nn.Module]], tokens: Tensor,
                      **role_kwargs: Any) -> Trajectory:
    """Score every ``(step, model)`` on the same probe ``tokens`` (``role_scores`` kwargs)."""
    from headwise.analysis.roles import role_scores

    return Trajectory([(step, role_scores(model, tokens, **role_kwargs))
                       for step, model in checkpoints])
