"""Parsing the per-head lever entries of a spec: masks, pattern objectives, entropy bounds.

Names map to constructors through fixed tables (``MASKS``, ``OBJECTIVE_TARGETS``); a spec can
only choose among them, never name code to import.
"""

from __future__ import annotations

from collections.abc import Callable
from types import MappingProxyType
from typing import Any

import headwise.validate as check
from headwise.errors import SpecError
from headwise.patterns import TARGET_ROLES
from headwise.runspec.schema import EntropySpec, MaskSpec, ObjectiveSpec

ParamCheck = Callable[[Any, str], Any]


def _segments(value: Any, path: str) -> int | tuple[int, ...]:
    if isinstance(value, list):
        if not value:
            raise check.fail(path, value, "a positive integer or a list of them")
        return tuple(check.integer(v, check.join(path, i), minimum=1)
                     for i, v in enumerate(value))
    return check.integer(value, path, minimum=1)


def _edges(value: Any, path: str) -> tuple[tuple[int, int], ...]:
    if not isinstance(value, list) or not value:
        raise check.fail(path, value, "a non-empty list of [query, key] position pairs")
    out = []
    for i, pair in enumerate(value):
        p = check.join(path, i)
        if not isinstance(pair, list) or len(pair) != 2:
            raise check.fail(p, pair, "a [query, key] pair of positions")
        out.append((check.integer(pair[0], p + "[0]", minimum=0),
                    check.integer(pair[1], p + "[1]", minimum=0)))
    return tuple(out)


def _matrix(value: Any, path: str) -> tuple[tuple[bool, ...], ...]:
    if not isinstance(value, list) or not value:
        raise check.fail(path, value, "a square list of rows of 0/1 (1 = may attend)")
    n = len(value)
    rows = []
    for i, row in enumerate(value):
        p = check.join(path, i)
        if not isinstance(row, list) or len(row) != n:
            raise check.fail(p, row, f"a row of {n} values 0/1 (the matrix is square)")
        for j, v in enumerate(row):
            if v not in (0, 1) or isinstance(v, float):
                raise check.fail(check.join(p, j), v, "0 or 1 (or false/true)")
        rows.append(tuple(bool(v) for v in row))
    return tuple(rows)


def _window(value: Any, path: str) -> int:
    return check.integer(value, path, minimum=1)


def _count(value: Any, path: str) -> int:
    return check.integer(value, path, minimum=1)


# mask name -> (required params, optional params), each param -> its checker.
MASKS: dict[str, tuple[dict[str, ParamCheck], dict[str, ParamCheck]]] = {
    "causal": ({}, {}),
    "previous_token": ({}, {}),
    "self_only": ({}, {}),
    "first_token": ({}, {}),
    "local": ({"window": _window}, {}),
    "block_diagonal": ({"segments": _segments}, {}),
    "from_graph": ({"edges": _edges}, {"n": _count}),
    "from_matrix": ({"matrix": _matrix}, {}),
}

# objective target -> (required params, optional params).
# Every role with a target pattern (headwise.patterns); ``local`` takes its window.
OBJECTIVE_TARGETS: dict[str, tuple[dict[str, ParamCheck], dict[str, ParamCheck]]] = {
    role: ({}, {"window": _window} if role == "local" else {}) for role in TARGET_ROLES
}


def _named(value: Any, path: str, table: dict[str, tuple[dict[str, ParamCheck],
                                                       dict[str, ParamCheck]]],
           what: str) -> tuple[str, dict[str, Any]]:
    """``name`` or ``{name: {param: value}}`` -> (name, checked params)."""
    raw: Any
    if isinstance(value, str):
        name, raw = value, {}
    elif isinstance(value, dict) and len(value) == 1:
        name, raw = next(iter(value.items()))
        if raw is None:
            raw = {}
    else:
        raise check.fail(path, value, f"a {what} name such as {sorted(table)[0]!r} or a "
                         f"one-key mapping like {{local: {{window: 3}}}}")
    name = check.string(name, path, sorted(table))
    required, optional = table[name]
    sub = check.join(path, name)
    raw = check.mapping(raw, sub, f"a mapping of parameters {sorted(required | optional)}")
    check.keys(raw, [*required, *optional], sub, required=required)
    params = {k: (required | optional)[k](v, check.join(sub, k)) for k, v in raw.items()}
    return name, params


def parse_mask(value: Any, path: str, seq_len: int | None = None) -> MaskSpec:
    """``previous_token`` or ``{local: {window: 3}}`` -> MaskSpec.

    Args:
        seq_len: the longest sequence the mask must cover (fixed-size masks are checked).
    """
    name, params = _named(value, path, MASKS, "mask")
    if seq_len is not None:
        covers = (len(params["matrix"]) if name == "from_matrix" else
                  sum(params["segments"]) if name == "block_diagonal"
                  and not isinstance(params["segments"], int) else None)
        if covers is not None and covers < seq_len:
            key = "matrix" if name == "from_matrix" else "segments"
            raise SpecError(f"{path}.{name}.{key}: covers {covers} positions, the data has "
                            f"sequences of {seq_len}; expected at least {seq_len}")
    return MaskSpec(name, MappingProxyType(params))


def parse_objective(value: Any, path: str) -> ObjectiveSpec:
    """``{target: previous_token, kind: ce, weight: 1.0}`` -> ObjectiveSpec.

    ``target`` may carry parameters: ``{target: {local: {window: 3}}}``.
    """
    data = check.mapping(value, path, "a mapping with keys target, kind, weight")
    check.keys(data, ["target", "kind", "weight"], path, required=["target"])
    target, params = _named(data["target"], check.join(path, "target"), OBJECTIVE_TARGETS,
                            "target")
    kind = check.string(data.get("kind", "ce"), check.join(path, "kind"), ["ce", "kl", "mse"])
    weight = check.number(data.get("weight", 1.0), check.join(path, "weight"), minimum=0.0)
    return ObjectiveSpec(target, kind, weight, MappingProxyType(params))  # type: ignore[arg-type]


def parse_entropy(value: Any, path: str) -> EntropySpec:
    """``{at_most: 0.6, at_least: 0.2, weight: 0.1}`` (normalised, in [0, 1]) -> EntropySpec."""
    data = check.mapping(value, path, "a mapping with keys at_least, at_most, weight")
    check.keys(data, ["at_least", "at_most", "weight"], path)
    lo = data.get("at_least")
    hi = data.get("at_most")
    lo = None if lo is None else check.number(lo, check.join(path, "at_least"), 0.0, 1.0)
    hi = None if hi is None else check.number(hi, check.join(path, "at_most"), 0.0, 1.0)
    if lo is None and hi is None:
        raise SpecError(f"{path}: expected at least one of at_least, at_most")
    if lo is not None and hi is not None and lo > hi:
        raise SpecError(f"{path}: at_least={lo} > at_most={hi}; expected at_least <= at_most")
    weight = check.number(data.get("weight", 1.0), check.join(path, "weight"), minimum=0.0)
    return EntropySpec(lo, hi, weight)
