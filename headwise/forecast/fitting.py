"""What every forecaster's fit shares: ridge regression, the conformal quantile that turns a
point forecast into an interval with a stated coverage, isotonic recalibration of a score
into a probability, and the range of runs it was fit on (recorded, checked against a run,
validated when read from a file)."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from typing import Any

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
    ``ceil(coverage (n + 1))``-th smallest (the largest when that exceeds n). With residuals
    of a held-out calibration set exchangeable with fresh data, ``|error| <=`` it with
    probability at least ``coverage``; on residuals that are not (cross-fitted, or rows of
    one run), the coverage is what the benchmark measures."""
    if len(residuals) == 0:
        raise ValueError("residuals: expected at least one")
    k = min(len(residuals) - 1, math.ceil(coverage * (len(residuals) + 1)) - 1)
    return float(residuals.sort().values[k])


def _pool(values: Sequence[float], weights: Sequence[float]) -> list[list[float]]:
    """Pool-adjacent-violators: the non-decreasing step fit of ``values`` (in order) under
    squared error weighted by ``weights``, as blocks [weighted sum, weight, first index,
    last index]."""
    blocks: list[list[float]] = []
    for i, (v, w) in enumerate(zip(values, weights, strict=True)):
        blocks.append([v * w, w, i, i])
        while len(blocks) > 1 and blocks[-2][0] * blocks[-1][1] >= blocks[-1][0] * blocks[-2][1]:
            s, w2, _, last = blocks.pop()
            blocks[-1][0] += s
            blocks[-1][1] += w2
            blocks[-1][3] = last
    return blocks


def isotonic(scores: Tensor, outcomes: Tensor, prior: float) -> tuple[list[float], list[float]]:
    """A non-decreasing map from a score to the probability of an outcome, as knots (score,
    probability): the isotonic regression of the 0/1 ``outcomes`` on ``scores``, each block's
    share smoothed by ``prior`` pseudo-outcomes (half of each kind, so no block says 0 or 1),
    then pooled again where smoothing broke the order. A knot sits at the mean score of its
    block; ``interpolate`` reads the map between and beyond them."""
    if len(scores) == 0:
        raise ValueError("scores: expected at least one")
    order = torch.argsort(scores, stable=True)
    x = scores[order].tolist()
    first = _pool(outcomes[order].tolist(), [1.0] * len(x))
    smoothed = [(s + prior / 2) / (w + prior) for s, w, _, _ in first]
    knots_x, knots_p = [], []
    for s, w, a, b in _pool(smoothed, [blk[1] for blk in first]):
        lo, hi = int(first[int(a)][2]), int(first[int(b)][3])  # the scores it pools
        knots_x.append(sum(x[lo:hi + 1]) / (hi - lo + 1))
        knots_p.append(s / w)
    return knots_x, knots_p


def interpolate(knots_x: Sequence[float], knots_p: Sequence[float], score: float) -> float:
    """``isotonic``'s map at ``score``: linear between knots, flat beyond the outer ones."""
    if score <= knots_x[0]:
        return float(knots_p[0])
    for i in range(1, len(knots_x)):
        if score <= knots_x[i]:
            x0, x1, p0, p1 = knots_x[i - 1], knots_x[i], knots_p[i - 1], knots_p[i]
            return float(p0 + (p1 - p0) * (score - x0) / max(x1 - x0, 1e-12))
    return float(knots_p[-1])


def span(values: Iterable[int | None]) -> list[int] | None:
    """``[min, max]`` of the known values (``None`` where none is known): a fitted range."""
    got = [v for v in values if v is not None]
    return [min(got), max(got)] if got else None


def fitted_range(features: Sequence[str], x: Tensor, contexts: Sequence[dict[str, Any]],
                 enforced: Sequence[bool]) -> dict[str, Any]:
    """The range of runs a forecaster was fit on: each feature's ``[low, high]`` over the rows
    ``x`` (M, F), the span of model sizes, the tasks, the per-head levers
    (``Spec.head_levers``) and whether runs were plain or enforced."""
    return {"features": {n: [float(lo), float(hi)] for n, lo, hi in
                         zip(features, x.min(0).values, x.max(0).values, strict=True)},
            "n_layers": span(c.get("n_layers") for c in contexts),
            "n_heads": span(c.get("n_heads") for c in contexts),
            "tasks": sorted({t for c in contexts for t in c.get("tasks", ())}),
            "levers": sorted({lever for c in contexts for lever in c.get("levers", ())}),
            "modes": sorted({"enforced" if e else "plain" for e in enforced})}


def outside_range(ranges: dict[str, Any], features: Sequence[str], low: Sequence[float],
                  high: Sequence[float], context: dict[str, Any], enforced: bool) -> list[str]:
    """Why a run lies outside ``ranges`` (empty: inside): a feature whose values ``low`` to
    ``high`` leave its fitted range by more than a tenth of it, a model size, a task, a
    per-head lever or a mode the fit never saw (levers only where ``ranges`` records them:
    files fit before they were recorded check none)."""
    why = []
    for name, got_lo, got_hi in zip(features, low, high, strict=True):
        lo, hi = ranges["features"][name]
        pad = 0.1 * (hi - lo)
        if got_lo < lo - pad or got_hi > hi + pad:
            shown = f"{got_lo:.3g}" if got_lo == got_hi else f"{got_lo:.3g} to {got_hi:.3g}"
            why.append(f"{name} {shown} outside the fitted {lo:.3g} to {hi:.3g}")
    for key in ("n_layers", "n_heads"):
        got, fitted = context.get(key), ranges.get(key)
        if got is not None and fitted is not None and not fitted[0] <= got <= fitted[1]:
            why.append(f"{key} {got} outside the fitted {fitted[0]} to {fitted[1]}")
    unseen = sorted(set(context.get("tasks", ())) - set(ranges["tasks"]))
    if unseen:
        why.append(f"tasks not in the fitted runs: {', '.join(unseen)}")
    if "levers" in ranges:
        new_levers = sorted(set(context.get("levers", ())) - set(ranges["levers"]))
        if new_levers:
            why.append(f"head levers not in the fitted runs: {', '.join(new_levers)}")
    mode = "enforced" if enforced else "plain"
    if mode not in ranges["modes"]:
        why.append(f"fitted on {'/'.join(ranges['modes'])} runs only, this is {mode}")
    return why


def check_ranges(ranges: Any, where: str, features: Sequence[str],
                 names: Sequence[str] = ("tasks", "modes")) -> dict[str, Any]:
    """A fitted range record as ``fitted_range`` writes it, read from a file: finite
    ``[low, high]`` (low <= high) per feature, integer spans or null for the model sizes, lists
    of names for ``names`` (``ValueError`` naming ``where`` and the field)."""
    def pair(v: Any, integers: bool = False) -> bool:
        kinds = (int,) if integers else (int, float)
        return (isinstance(v, list) and len(v) == 2
                and all(isinstance(x, kinds) and not isinstance(x, bool) for x in v)
                and all(math.isfinite(x) for x in v) and v[0] <= v[1])

    if not isinstance(ranges, dict):
        raise ValueError(f"{where}: expected an object")
    feats = ranges.get("features")
    if not isinstance(feats, dict) or set(feats) != set(features) or not all(
            pair(v) for v in feats.values()):
        raise ValueError(f"{where}.features: expected finite [low, high] (low <= high) for "
                         f"each of {list(features)}")
    for key in ("n_layers", "n_heads"):
        if ranges.get(key) is not None and not pair(ranges[key], integers=True):
            raise ValueError(f"{where}.{key}: expected integers [low, high] or null")
    for key in (*names, *(("levers",) if "levers" in ranges else ())):
        v = ranges.get(key)
        if not isinstance(v, list) or not all(isinstance(x, str) for x in v):
            raise ValueError(f"{where}.{key}: expected a list of names")
    return ranges


def finite_vector(value: Any, size: int, field: str) -> Tensor:
    """``value`` (read from a forecaster file) as ``size`` finite float64 numbers
    (``ValueError`` naming ``field`` otherwise)."""
    if not isinstance(value, list) or any(isinstance(x, bool) for x in value):
        raise ValueError(f"{field}: expected {size} finite numbers (not booleans)")
    try:
        t = torch.tensor(value, dtype=torch.float64)
    except (TypeError, ValueError, RuntimeError):
        raise ValueError(f"{field}: expected {size} finite numbers") from None
    if tuple(t.shape) != (size,) or not bool(t.isfinite().all()):
        raise ValueError(f"{field}: expected {size} finite numbers")
    return t


def finite_number(value: Any, field: str) -> float:
    """``value`` (read from a forecaster file) as a finite number (``ValueError`` naming
    ``field`` otherwise; a bool is not a number)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(
            value):
        raise ValueError(f"{field}: expected a finite number")
    return float(value)


def checked_measured(measured: Any, quote: Callable[[dict[str, Any]], str], field: str,
                     what: str) -> dict[str, Any]:
    """A forecaster file's ``measured`` record, refused unless its figures are what reports
    may quote (``check_figures``) and ``quote`` (the sentence reports make of it) can read it:
    ``ValueError`` naming ``field`` and ``what`` it should hold."""
    try:
        if not isinstance(measured, dict):
            raise TypeError(f"got {type(measured).__name__}")
        check_figures(measured, field)
        quote(measured)
    except (AttributeError, KeyError, TypeError) as e:
        raise ValueError(f"{field}: expected an object with {what} "
                         f"({type(e).__name__}: {e})") from None
    except ValueError as e:
        raise ValueError(f"{field}: expected an object with {what} ({e})") from None
    return measured


def check_figures(record: Any, field: str) -> None:
    """Refuse a figure a report would quote wrongly: every number in a ``measured`` record is
    a share in [0, 1] (a fraction, an accuracy, a calibration error: written as a float) or a
    count (a non-negative integer: runs, heads, seeds), never a boolean, NaN or infinite.

    Raises:
        ValueError: naming the field (its path in the record) and the value.
    """
    stack: list[tuple[str, Any]] = [(field, record)]
    while stack:
        where, value = stack.pop()
        if isinstance(value, dict):
            stack.extend((f"{where}.{k}", v) for k, v in value.items())
        elif isinstance(value, list):
            stack.extend((f"{where}[{i}]", v) for i, v in enumerate(value))
        elif isinstance(value, bool):
            raise ValueError(f"{where}: got {value}, expected a number (a share or a count)")
        elif isinstance(value, float) and not 0.0 <= value <= 1.0:
            raise ValueError(f"{where}: got {value}, expected a share in [0, 1]")
        elif isinstance(value, int) and value < 0:
            raise ValueError(f"{where}: got {value}, expected a count (an integer >= 0)")
