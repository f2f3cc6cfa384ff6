"""Parsing a contract: raw clause mappings (YAML/JSON) into a validated ``Contract``.

Each clause is parsed by the kind that claims it (``headwise.contract.kinds``); then the clauses
are checked together: bounds on one quantity that cannot both hold, a drop larger than a task
clause lets the task's metric be, a head exclusive to two task lists. Errors are ``SpecError``
whose message starts with the clause path, e.g. ``contract[2].drop_at_least: got 'x', expected
a finite number``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from headwise.contract import fields
from headwise.contract.clause import Clause, Contract
from headwise.contract.kind import ClauseKind, ParseContext
from headwise.contract.kinds import EVERY_KEY, KINDS
from headwise.errors import SpecError
from headwise.validate import fail, mapping

EXAMPLE = "{head: L0.H0, score: previous_token, at_least: 0.9}"
MAX_CLAUSES = 512  # each clause is measured at every evaluation point


def parse_contract(clauses: Any, n_layers: int, n_heads: int, tasks: Sequence[str],
                   probes: Sequence[str] | None = None) -> Contract:
    """Validate ``clauses`` (a list of mappings, or ``None``: no contract) and build the contract.

    Args:
        probes: the probe names score clauses may measure ``on`` (``None``: not checked).

    Raises:
        SpecError: the first problem found, its message starting with the clause path.
    """
    if clauses is None:
        return Contract.empty(n_layers, n_heads, tasks)
    if not isinstance(clauses, (list, tuple)):
        raise fail("contract", clauses, f"a list of clauses such as {EXAMPLE}")
    if len(clauses) > MAX_CLAUSES:
        raise SpecError(f"contract: got {len(clauses)} clauses, expected at most {MAX_CLAUSES} "
                        "(any_of / all_of name many heads in one clause)")
    ctx = ParseContext(n_layers, n_heads, tuple(tasks))
    parsed = tuple(_parse(i, raw, ctx) for i, raw in enumerate(clauses))
    _check_together(parsed)
    for c in parsed:
        if probes is not None and c.on is not None and c.on not in probes:
            raise SpecError(f"{c.path}.on: got {c.on!r}, expected one of the probes "
                            f"{list(probes)} (declare others under probes:)")
    return Contract(parsed, n_layers, n_heads, tuple(tasks))


def kind_of(path: str, raw: dict[str, Any]) -> ClauseKind:
    """The kind that claims ``raw``.

    Raises:
        SpecError: an unknown key, or no kind claims the clause.
    """
    for kind in KINDS.values():
        if kind.claims(raw):
            return kind
    unknown = [k for k in raw if k not in EVERY_KEY]
    if unknown:
        k = unknown[0]
        raise SpecError(f"{path}: unknown key {k!r}{fields.suggest(k, EVERY_KEY)}")
    raise SpecError(f"{path}: cannot tell the clause kind; expected a 'score' clause, an "
                    "'ablate' clause, a 'task' clause or 'exclusive: true'")


def _parse(i: int, raw: Any, ctx: ParseContext) -> Clause:
    path = f"contract[{i}]"
    raw = mapping(raw, path, f"a clause mapping such as {EXAMPLE}")
    kind = kind_of(path, raw)
    fields.check_keys(path, raw, kind.name, kind.keys, EVERY_KEY)
    return kind.parse(path, i, raw, ctx)


def _check_together(clauses: tuple[Clause, ...]) -> None:
    """Reject clauses that contradict each other (see the module docstring)."""
    bounds: dict[tuple[Any, ...], tuple[float, int, float, int]] = {}
    for c in clauses:
        for key, what in KINDS[c.kind].bounded(c):
            lo, lo_i, hi, hi_i = bounds.get(key, (-math.inf, -1, math.inf, -1))
            if c.at_least is not None and c.at_least > lo:
                lo, lo_i = c.at_least, c.index
            if c.at_most is not None and c.at_most < hi:
                hi, hi_i = c.at_most, c.index
            if lo > hi:
                raise SpecError(f"contract[{max(lo_i, hi_i)}]: contradicts "
                                f"contract[{min(lo_i, hi_i)}]: {what} must be >= {lo:g} and "
                                f"<= {hi:g}")
            bounds[key] = (lo, lo_i, hi, hi_i)
    for c in clauses:
        for key, need in KINDS[c.kind].needs_clean(c):
            _, _, cap, cap_i = bounds.get(key, (-math.inf, -1, math.inf, -1))
            if need > cap:
                capper = clauses[cap_i]
                raise SpecError(f"{c.path}: contradicts {capper.path}: a {key[1]} {key[2]} "
                                f"drop >= {need:g} needs {key[2]} >= {need:g}, but "
                                f"{capper.path} caps it at {cap:g}")
    for kind in KINDS.values():
        kind.check_together([c for c in clauses if c.kind == kind.name])
