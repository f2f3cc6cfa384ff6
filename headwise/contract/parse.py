"""Parsing a contract: raw clause mappings (YAML/JSON) into a validated ``Contract``.

Each clause is parsed by the kind that claims it (``headwise.contract.kinds``); then the clauses
are checked together: bounds on one quantity that cannot both hold, a drop larger than a task
clause lets the task's metric be, a head exclusive to two task lists. Errors are ``SpecError``
whose message starts with the clause path, e.g. ``contract[2].drop_at_least: got 'x', expected
a finite number``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from headwise.contract import fields
from headwise.contract.clause import Clause, Contract
from headwise.contract.kind import ClauseKind, ParseContext
from headwise.contract.kinds import EVERY_KEY, KINDS
from headwise.errors import SpecError, did_you_mean
from headwise.validate import fail, mapping

EXAMPLE = "{head: L0.H0, score: previous_token, at_least: 0.9}"
MAX_CLAUSES = 512  # each clause is measured at every evaluation point


def parse_contract(clauses: Any, n_layers: int, n_heads: int, tasks: Sequence[str],
                   probes: Sequence[str] | None = None,
                   kinds: Mapping[str, ClauseKind] | None = None,
                   config: Any = None) -> Contract:
    """Validate ``clauses`` (a list of mappings, or ``None``: no contract) and build the contract.

    Args:
        probes: the probe names score clauses may measure ``on`` (``None``: not checked).
        kinds: the clause kinds, asked in order which one a raw clause is (default ``KINDS``;
            a kind defined elsewhere joins as ``{**KINDS, kind.name: kind}``, before the
            built-in kinds if it must claim clauses they would).
        config: the model's ``ModelConfig``, for the shape of its graph of paths (kv heads,
            MLPs, norm order: ``path`` and ``circuit`` clauses); ``None``: one kv head per head,
            MLPs, pre-norm.

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
    registry = KINDS if kinds is None else kinds
    ctx = ParseContext(n_layers, n_heads, tuple(tasks)) if config is None else ParseContext(
        n_layers, n_heads, tuple(tasks), config.n_kv_heads, not config.attn_only,
        config.norm == "post")
    parsed = tuple(_parse(i, raw, ctx, registry) for i, raw in enumerate(clauses))
    _check_together(parsed)
    for c in parsed:
        if probes is not None and c.on is not None and c.on not in probes:
            raise SpecError(f"{c.path}.on: got {c.on!r}, expected one of the probes "
                            f"{list(probes)} (declare others under probes:)")
    return Contract(parsed, n_layers, n_heads, tuple(tasks))


def kind_of(path: str, raw: dict[str, Any],
            kinds: Mapping[str, ClauseKind] | None = None) -> ClauseKind:
    """The kind of ``kinds`` (default ``KINDS``) that claims ``raw``.

    Raises:
        SpecError: an unknown key, or no kind claims the clause.
    """
    registry = KINDS if kinds is None else kinds
    for kind in registry.values():
        if kind.claims(raw):
            return kind
    every = every_key(registry)
    unknown = [k for k in raw if k not in every]
    if unknown:
        k = unknown[0]
        raise SpecError(f"{path}.{k}: unknown key{did_you_mean(k, every)}; expected one of "
                        f"{sorted(every)}")
    raise SpecError(f"{path}: cannot tell the clause kind; expected a 'score' clause, an "
                    "'ablate' clause, a 'task' clause, 'exclusive: true', a 'path', a "
                    "'circuit' or a 'preserve' clause")


def every_key(kinds: Mapping[str, ClauseKind]) -> list[str]:
    """Every key some kind of ``kinds`` reads (for unknown-key messages)."""
    return EVERY_KEY if kinds is KINDS else sorted(set().union(*(k.keys
                                                                 for k in kinds.values())))


def _parse(i: int, raw: Any, ctx: ParseContext, kinds: Mapping[str, ClauseKind]) -> Clause:
    path = f"contract[{i}]"
    raw = mapping(raw, path, f"a clause mapping such as {EXAMPLE}")
    kind = kind_of(path, raw, kinds)
    fields.check_keys(path, raw, kind.name, kind.keys, every_key(kinds))
    return kind.parse(path, i, raw, ctx)


def _check_together(clauses: tuple[Clause, ...]) -> None:
    """Reject clauses that contradict each other (see the module docstring)."""
    bounds: dict[tuple[Any, ...], tuple[float, int, float, int]] = {}
    for c in clauses:
        for key, what in c.entry.bounded(c):
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
        for key, need in c.entry.needs_clean(c):
            _, _, cap, cap_i = bounds.get(key, (-math.inf, -1, math.inf, -1))
            if need > cap:
                capper = clauses[cap_i]
                raise SpecError(f"{c.path}: contradicts {capper.path}: a {key[1]} {key[2]} "
                                f"drop >= {need:g} needs {key[2]} >= {need:g}, but "
                                f"{capper.path} caps it at {cap:g}")
    by_kind: dict[str, list[Clause]] = {}
    for c in clauses:
        by_kind.setdefault(c.kind, []).append(c)
    for mine in by_kind.values():
        mine[0].entry.check_together(mine)
