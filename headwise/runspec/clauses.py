"""Parsing and validation of contract clauses (YAML/JSON dicts) into a ``Contract``.

User input is validated in ``headwise.runspec``; the clause types and their verification stay
in ``headwise.analysis.contract`` / ``headwise.analysis.verify``. Clause kinds are listed there
(full reference in docs/contracts.md).

Errors are ``SpecError`` whose message starts with the clause path, e.g.
``contract[2].drop_at_least: got 'x', expected a number``.
"""

from __future__ import annotations

import difflib
import math
from collections.abc import Sequence
from typing import Any

from headwise.analysis.contract import (
    DEFAULT_EXCLUSIVE_DROP,
    DEFAULT_OTHERS_DROP,
    METRICS,
    MODES,
    UNIT_METRICS,
    Clause,
    Contract,
)
from headwise.analysis.roles import ROLES
from headwise.errors import SelectorError, SpecError, show
from headwise.heads import Head, HeadSet
from headwise.runspec.check import mapping

_COMMON = {"name"}
_KEYS = {
    "score": {"head", "any_of", "all_of", "score", "on", "at_least", "at_most"} | _COMMON,
    "ablation": {"ablate", "any_of", "all_of", "task", "metric", "mode", "drop_at_least",
                 "drop_at_most"} | _COMMON,
    "exclusive": {"heads", "tasks", "exclusive", "metric", "mode", "drop_at_least",
                  "others_drop_at_most"} | _COMMON,
    "task": {"task", "metric", "at_least", "at_most"} | _COMMON,
}
_ALL_KEYS = sorted(set().union(*_KEYS.values()))
_SCORE_RANGE = {"copying_eig": (-1.0, 1.0)}


def contract_from_list(clauses: Any, n_layers: int, n_heads: int,
                       tasks: Sequence[str]) -> Contract:
    """Validate ``clauses`` (a list of dicts) and build the contract.

    Raises:
        SpecError: the first problem found, its message starting with the clause path.
    """
    if not isinstance(clauses, (list, tuple)):
        raise SpecError(f"contract: got {type(clauses).__name__}, expected a list of clauses")
    parsed = [_parse(i, c, n_layers, n_heads, list(tasks)) for i, c in enumerate(clauses)]
    _check_consistent(parsed)
    return Contract(parsed, n_layers, n_heads, tasks)


def _suggest(word: str, options: Sequence[str]) -> str:
    close = difflib.get_close_matches(word, list(options), n=1)
    return f"; did you mean {close[0]!r}?" if close else ""


def _kind(path: str, raw: dict[str, Any]) -> str:
    if "exclusive" in raw:
        return "exclusive"
    if "score" in raw:
        return "score"
    if ("ablate" in raw or any(k.startswith("drop_at") for k in raw)
            or ("task" in raw and ("any_of" in raw or "all_of" in raw))):
        return "ablation"
    if "task" in raw:
        return "task"
    unknown = [k for k in raw if k not in _ALL_KEYS]
    if unknown:
        k = unknown[0]
        raise SpecError(f"{path}: unknown key {k!r}{_suggest(k, _ALL_KEYS)}")
    raise SpecError(f"{path}: cannot tell the clause kind; expected a 'score' clause, an "
                    "'ablate' clause, a 'task' clause or 'exclusive: true'")


def _number(path: str, raw: dict[str, Any], key: str) -> float | None:
    if key not in raw:
        return None
    v = raw[key]
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
        raise SpecError(f"{path}.{key}: got {_short(v)}, expected a finite number")
    return float(v)


def _short(value: Any) -> str:
    """``repr`` cut to 60 characters (a clause value may be huge)."""
    return show(value, 60)


def _choice(path: str, raw: dict[str, Any], key: str, options: Sequence[str],
            default: str | None = None) -> str | None:
    if key not in raw:
        return default
    v = raw[key]
    if not isinstance(v, str) or v not in options:
        hint = _suggest(v, options) if isinstance(v, str) else ""
        raise SpecError(f"{path}.{key}: got {v!r}, expected one of {list(options)}{hint}")
    return v


def _heads(path: str, key: str, value: Any, n_layers: int, n_heads: int) -> HeadSet:
    if not isinstance(value, (str, list, tuple)):
        raise SpecError(f"{path}.{key}: got {value!r}, expected a head selector like 'L1.H2'")
    try:
        hs = HeadSet.parse(value, n_layers, n_heads)
    except SelectorError as e:
        raise SpecError(f"{path}.{key}: {e}") from None
    if not len(hs):
        raise SpecError(f"{path}.{key}: got {value!r}, expected at least one head")
    return hs


def _parse(i: int, raw: Any, n_layers: int, n_heads: int, tasks: list[str]) -> Clause:
    path = f"contract[{i}]"
    raw = mapping(raw, path, "a mapping (one clause)")
    kind = _kind(path, raw)
    if kind == "task":
        return _task_clause(path, i, raw, tasks, HeadSet([], n_layers, n_heads))
    _check_keys(path, raw, kind)
    subjects = {"score": ("head", "any_of", "all_of"), "ablation": ("ablate", "any_of", "all_of"),
                "exclusive": ("heads",)}[kind]
    given = [k for k in subjects if k in raw]
    if len(given) != 1:
        raise SpecError(f"{path}: got subject keys {given}, expected exactly one of "
                        f"{list(subjects)}")
    subject = given[0]
    heads = _heads(path, subject, raw[subject], n_layers, n_heads)
    quantifier = {"ablate": "set", "heads": "set"}.get(subject, subject)
    if subject == "head" and len(heads) != 1:
        raise SpecError(f"{path}.head: got {raw['head']!r} ({len(heads)} heads), expected one "
                        "head; use any_of or all_of for several")
    name = raw.get("name")
    if name is not None and not isinstance(name, str):
        raise SpecError(f"{path}.name: got {name!r}, expected a string")
    common: dict[str, Any] = {"index": i, "kind": kind, "quantifier": quantifier,
                              "heads": heads, "name": name, "source": dict(raw)}
    if kind == "score":
        return _score_clause(path, raw, common)
    if kind == "ablation":
        return _ablation_clause(path, raw, common, tasks)
    return _exclusive_clause(path, raw, common, tasks)


def _check_keys(path: str, raw: dict[str, Any], kind: str) -> None:
    """Reject keys that belong to no clause kind, or to another kind than ``kind``."""
    allowed = _KEYS[kind]
    for key in raw:
        if key not in allowed:
            if key in _ALL_KEYS:
                raise SpecError(f"{path}.{key}: not allowed in a {kind} clause; allowed keys: "
                                f"{sorted(allowed)}")
            raise SpecError(f"{path}: unknown key {key!r}{_suggest(key, sorted(allowed))} "
                            f"(allowed keys: {sorted(allowed)})")


def _ablation_clause(path: str, raw: dict[str, Any], common: dict[str, Any],
                     tasks: list[str]) -> Clause:
    """``{ablate|any_of|all_of: heads, task, metric, mode, drop_at_least, drop_at_most}``."""
    metric = _choice(path, raw, "metric", METRICS, "accuracy")
    mode = _choice(path, raw, "mode", MODES, "zero")
    task = _task(path, "task", raw.get("task"), tasks)
    lo, hi = _number(path, raw, "drop_at_least"), _number(path, raw, "drop_at_most")
    if lo is None and hi is None:
        raise SpecError(f"{path}: missing bound; expected 'drop_at_least' and/or "
                        "'drop_at_most'")
    _bounds(path, "drop_at_least", lo, "drop_at_most", hi)
    if metric in UNIT_METRICS:
        for key, v in (("drop_at_least", lo), ("drop_at_most", hi)):
            if v is not None and not -1.0 <= v <= 1.0:
                raise SpecError(f"{path}.{key}: got {v}, expected an {metric} drop in "
                                "[-1, 1]")
    return Clause(**common, task=task, metric=metric or "accuracy", mode=mode or "zero",
                  at_least=lo, at_most=hi)


def _exclusive_clause(path: str, raw: dict[str, Any], common: dict[str, Any],
                      tasks: list[str]) -> Clause:
    """``{heads, tasks, exclusive: true, metric, mode, drop_at_least, others_drop_at_most}``."""
    metric = _choice(path, raw, "metric", METRICS, "accuracy")
    mode = _choice(path, raw, "mode", MODES, "zero")
    if raw.get("exclusive") is not True:
        raise SpecError(f"{path}.exclusive: got {raw.get('exclusive')!r}, expected true")
    listed = raw.get("tasks")
    if isinstance(listed, str):
        listed = [listed]
    if not isinstance(listed, (list, tuple)) or not listed:
        raise SpecError(f"{path}.tasks: got {listed!r}, expected a non-empty list of task names")
    names = tuple(_task(path, f"tasks[{j}]", t, tasks) for j, t in enumerate(listed))
    lo = _number(path, raw, "drop_at_least")
    hi = _number(path, raw, "others_drop_at_most")
    lo = DEFAULT_EXCLUSIVE_DROP if lo is None else lo
    hi = DEFAULT_OTHERS_DROP if hi is None else hi
    if lo <= hi:
        raise SpecError(f"{path}: drop_at_least {lo} must exceed others_drop_at_most {hi} for "
                        "exclusivity to mean anything")
    if metric in UNIT_METRICS and not (-1.0 <= hi and lo <= 1.0):
        raise SpecError(f"{path}.drop_at_least: got {lo}, expected an {metric} drop in [-1, 1]")
    return Clause(**common, tasks=names, metric=metric or "accuracy", mode=mode or "zero",
                  at_least=lo, at_most=hi)


def _task_clause(path: str, i: int, raw: dict[str, Any], tasks: list[str],
                 no_heads: HeadSet) -> Clause:
    """``{task: T, metric: accuracy|exact|loss, at_least, at_most}``: T's own performance."""
    _check_keys(path, raw, "task")
    task = _task(path, "task", raw.get("task"), tasks)
    metric = _choice(path, raw, "metric", METRICS, "accuracy") or "accuracy"
    lo, hi = _number(path, raw, "at_least"), _number(path, raw, "at_most")
    if lo is None and hi is None:
        raise SpecError(f"{path}: missing bound; expected 'at_least' and/or 'at_most' (a task "
                        f"floor such as {{task: {task}, metric: accuracy, at_least: 0.95}})")
    _bounds(path, "at_least", lo, "at_most", hi)
    low, high = (0.0, 1.0) if metric in UNIT_METRICS else (0.0, math.inf)
    for key, v in (("at_least", lo), ("at_most", hi)):
        if v is not None and not low <= v <= high:
            raise SpecError(f"{path}.{key}: got {v}, expected a number in [{low:g}, {high:g}] "
                            f"(the range of {metric})")
    name = raw.get("name")
    if name is not None and not isinstance(name, str):
        raise SpecError(f"{path}.name: got {_short(name)}, expected a string")
    return Clause(index=i, kind="task", quantifier="model", heads=no_heads, task=task,
                  metric=metric, at_least=lo, at_most=hi, name=name, source=dict(raw))


def _score_clause(path: str, raw: dict[str, Any], common: dict[str, Any]) -> Clause:
    score = _choice(path, raw, "score", ROLES)
    on = raw.get("on")
    if on is not None and not isinstance(on, str):
        raise SpecError(f"{path}.on: got {on!r}, expected the name of a probe data set")
    lo, hi = _number(path, raw, "at_least"), _number(path, raw, "at_most")
    if lo is None and hi is None:
        raise SpecError(f"{path}: missing bound; expected 'at_least' and/or 'at_most'")
    _bounds(path, "at_least", lo, "at_most", hi)
    low, high = _SCORE_RANGE.get(score or "", (0.0, 1.0))
    for key, v in (("at_least", lo), ("at_most", hi)):
        if v is not None and not low <= v <= high:
            raise SpecError(f"{path}.{key}: got {v}, expected a number in [{low}, {high}] "
                            f"(the range of {score})")
    return Clause(**common, score=score, on=on, at_least=lo, at_most=hi)


def _bounds(path: str, lo_key: str, lo: float | None, hi_key: str, hi: float | None) -> None:
    if lo is not None and hi is not None and lo > hi:
        raise SpecError(f"{path}: {lo_key} {lo} > {hi_key} {hi}; the clause can never hold")


def _task(path: str, key: str, value: Any, tasks: list[str]) -> str:
    if value is None:
        raise SpecError(f"{path}.{key}: missing; expected one of the tasks {tasks}")
    if not isinstance(value, str) or value not in tasks:
        hint = _suggest(value, tasks) if isinstance(value, str) else ""
        raise SpecError(f"{path}.{key}: got {value!r}, expected one of the tasks {tasks}{hint}")
    return value


def _check_consistent(clauses: list[Clause]) -> None:
    """Reject clauses that contradict each other (per-head bounds, exclusivity, task floors)."""
    _check_drops_fit_tasks(clauses)
    bounds: dict[tuple[Any, ...], tuple[float, int, float, int]] = {}
    exclusive: dict[Head, Clause] = {}
    for c in clauses:
        if c.kind == "exclusive":
            for h in c.heads:
                other = exclusive.get(h)
                if other is not None and set(other.tasks) != set(c.tasks):
                    raise SpecError(f"{c.path}: {h} is required exclusive to {list(c.tasks)} "
                                    f"here and to {list(other.tasks)} in {other.path}")
                exclusive[h] = c
            continue
        if c.quantifier == "any_of":
            continue  # "some head" bounds constrain no particular head
        subjects: list[Any] = ([f"{c.heads} "] if c.quantifier == "set" else
                               [""] if c.kind == "task" else
                               [f"{h} " for h in c.heads])
        for s in subjects:
            key = (c.kind, s, c.score, c.on, c.task, c.metric, c.mode)
            lo, lo_i, hi, hi_i = bounds.get(key, (-float("inf"), -1, float("inf"), -1))
            if c.at_least is not None and c.at_least > lo:
                lo, lo_i = c.at_least, c.index
            if c.at_most is not None and c.at_most < hi:
                hi, hi_i = c.at_most, c.index
            if lo > hi:
                what = (c.score if c.kind == "score" else f"{c.task} {c.metric}"
                        if c.kind == "task" else f"{c.task} {c.metric} drop")
                raise SpecError(f"contract[{max(lo_i, hi_i)}]: contradicts "
                                f"contract[{min(lo_i, hi_i)}]: {s}{what} must be >= {lo:g} "
                                f"and <= {hi:g}")
            bounds[key] = (lo, lo_i, hi, hi_i)


def _check_drops_fit_tasks(clauses: list[Clause]) -> None:
    """An accuracy (or exact) drop of ``d`` needs a clean value of at least ``d``: a task clause
    capping that metric below ``d`` contradicts the ablation or exclusive clause."""
    caps = {(c.task, c.metric): c for c in clauses
            if c.kind == "task" and c.at_most is not None and c.metric in UNIT_METRICS}
    for c in clauses:
        if c.kind not in ("ablation", "exclusive") or c.at_least is None:
            continue
        for task in (c.tasks if c.kind == "exclusive" else (c.task,)):
            cap = caps.get((task, c.metric))
            if cap is not None and cap.at_most is not None and c.at_least > cap.at_most:
                raise SpecError(f"{c.path}: contradicts {cap.path}: a {task} {c.metric} drop "
                                f">= {c.at_least:g} needs {c.metric} >= {c.at_least:g}, but "
                                f"{cap.path} caps it at {cap.at_most:g}")
