"""What every forecaster's fit shares: ridge regression, the split-conformal quantile that
turns a point forecast into an interval with a stated coverage, and the span of the runs it
was fit on."""

from __future__ import annotations

import math
from collections.abc import Iterable

import torch
from torch import Tensor


def ridge(design: Tensor, target: Tensor, l2: float) -> Tensor:
    """Coefficients of ``target ~ design`` (float64) with an L2 penalty ``l2`` on every column
    but the last, which holds the intercept's ones and is left free."""
    penalty = l2 * torch.eye(design.shape[1], dtype=design.dtype)
    penalty[-1, -1] = 0.0
    return torch.linalg.solve(design.T @ design + penalty, design.T @ target)


def conformal_quantile(residuals: Tensor, coverage: float) -> float:
    """The split-conformal ``coverage`` quantile of absolute residuals: the
    ``ceil(coverage (n + 1))``-th smallest (the largest when that exceeds n). On exchangeable
    fresh data, ``|error| <=`` it with probability at least ``coverage``."""
    if len(residuals) == 0:
        raise ValueError("residuals: expected at least one")
    k = min(len(residuals) - 1, math.ceil(coverage * (len(residuals) + 1)) - 1)
    return float(residuals.sort().values[k])


def span(values: Iterable[int | None]) -> list[int] | None:
    """``[min, max]`` of the known values (``None`` where none is known): a fitted range."""
    got = [v for v in values if v is not None]
    return [min(got), max(got)] if got else None
