"""Validators for the fields of a contract clause; each raises ``SpecError`` naming
``contract[i].key`` (``<path>: got <value>, expected <what>``)."""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from typing import Any

from headwise.errors import SelectorError, SpecError, did_you_mean, show
from headwise.heads import HeadSet


def check_keys(path: str, raw: dict[str, Any], kind: str, allowed: Iterable[str],
               every_key: Iterable[str]) -> None:
    """Reject keys of another kind than ``kind`` and keys of no kind at all."""
    allowed, every_key = sorted(allowed), set(every_key)
    for key in raw:
        if key not in allowed:
            if key in every_key:
                raise SpecError(f"{path}.{key}: not allowed in a {kind} clause; expected one of "
                                f"{allowed}")
            raise SpecError(f"{path}.{key}: unknown key{did_you_mean(key, allowed)}; "
                            f"expected one of {allowed}")


def number(path: str, raw: dict[str, Any], key: str) -> float | None:
    """``raw[key]`` as a finite float (``None`` when absent)."""
    if key not in raw:
        return None
    v = raw[key]
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
        raise SpecError(f"{path}.{key}: got {show(v, 60)}, expected a finite number")
    return float(v)


def choice(path: str, raw: dict[str, Any], key: str, options: Sequence[str],
           default: str) -> str:
    """``raw[key]`` if it is one of ``options`` (``default`` when absent)."""
    if key not in raw:
        return default
    v = raw[key]
    if not isinstance(v, str) or v not in options:
        hint = did_you_mean(v, options)
        raise SpecError(f"{path}.{key}: got {show(v, 60)}, expected one of {list(options)}"
                        f"{hint}")
    return v


def heads(path: str, key: str, value: Any, n_layers: int, n_heads: int) -> HeadSet:
    """A non-empty head selector."""
    if not isinstance(value, (str, list, tuple)):
        raise SpecError(f"{path}.{key}: got {show(value, 60)}, expected a head selector like "
                        "'L1.H2'")
    try:
        hs = HeadSet.parse(value, n_layers, n_heads)
    except SelectorError as e:
        raise SpecError(f"{path}.{key}: {e}") from None
    if not len(hs):
        raise SpecError(f"{path}.{key}: got {show(value, 60)}, expected at least one head")
    return hs


def subject(path: str, raw: dict[str, Any], keys: Sequence[str], n_layers: int,
            n_heads: int) -> tuple[str, HeadSet]:
    """The one subject key of ``keys`` the clause gives, and its heads (``head`` must name
    exactly one)."""
    given = [k for k in keys if k in raw]
    if len(given) != 1:
        raise SpecError(f"{path}: got subject keys {given}, expected exactly one of {list(keys)}")
    key = given[0]
    hs = heads(path, key, raw[key], n_layers, n_heads)
    if key == "head" and len(hs) != 1:
        raise SpecError(f"{path}.head: got {raw['head']!r} ({len(hs)} heads), expected one "
                        "head; use any_of or all_of for several")
    return key, hs


def name(path: str, raw: dict[str, Any]) -> str | None:
    """The optional ``name`` the user gives a clause (printed: printable characters only)."""
    v = raw.get("name")
    if v is not None and (not isinstance(v, str) or not v.isprintable()):
        raise SpecError(f"{path}.name: got {show(v, 60)}, expected a string of printable "
                        "characters")
    return v


def ordered(path: str, lo_key: str, lo: float | None, hi_key: str, hi: float | None) -> None:
    """A lower bound above an upper bound can never hold."""
    if lo is not None and hi is not None and lo > hi:
        raise SpecError(f"{path}: {lo_key} {lo} > {hi_key} {hi}; the clause can never hold")


def in_range(path: str, values: dict[str, float | None], low: float, high: float,
             expected: str) -> None:
    """Every bound in ``values`` lies in ``[low, high]`` (``expected``: the range in words)."""
    for key, v in values.items():
        if v is not None and not low <= v <= high:
            raise SpecError(f"{path}.{key}: got {v}, expected {expected}")


def task(path: str, key: str, value: Any, tasks: Sequence[str]) -> str:
    """One of the spec's task names."""
    if value is None:
        raise SpecError(f"{path}.{key}: missing; expected one of the tasks {list(tasks)}")
    if not isinstance(value, str) or value not in tasks:
        hint = did_you_mean(value, tasks)
        raise SpecError(f"{path}.{key}: got {show(value, 60)}, expected one of the tasks "
                        f"{list(tasks)}{hint}")
    return value


def drop_bounds(path: str, raw: dict[str, Any], metric: str,
                low: float, high: float) -> tuple[float | None, float | None]:
    """``(drop_at_least, drop_at_most)`` of an ablation or path clause: at least one given,
    ordered, and in ``[low, high]`` (the range of a drop in ``metric``).

    Raises:
        SpecError: no bound, bounds that cannot both hold, or one out of range.
    """
    lo = number(path, raw, "drop_at_least")
    hi = number(path, raw, "drop_at_most")
    if lo is None and hi is None:
        raise SpecError(f"{path}: missing bound; expected 'drop_at_least' and/or "
                        "'drop_at_most'")
    ordered(path, "drop_at_least", lo, "drop_at_most", hi)
    in_range(path, {"drop_at_least": lo, "drop_at_most": hi}, low, high,
             f"an {metric} drop in [{low:g}, {high:g}]")
    return lo, hi
