"""Checking a spec's ``contract:`` list: structure, clause validity and contradictory bounds.

Clause semantics belong to ``headwise.analysis.contract.Contract.from_list``; this module adds
the spec's field paths (``contract[2].at_least``) and catches pairs of clauses no model can
satisfy together (``at_least`` above another clause's ``at_most`` on the same measurement).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from headwise.config import ModelConfig
from headwise.errors import HeadwiseError, SpecError
from headwise.spec import check

# (lower bound key, upper bound key) pairs that bound one measured quantity.
_BOUNDS = (("at_least", "at_most"), ("drop_at_least", "drop_at_most"))


def parse_contract(value: Any, config: ModelConfig, tasks: tuple[str, ...]
                   ) -> tuple[Mapping[str, Any], ...]:
    """Validate ``contract:`` and return its clauses.

    Raises:
        SpecError: not a list of mappings, a clause ``Contract.from_list`` rejects, or two
            clauses that contradict each other.
    """
    if value is None:
        return ()
    if not isinstance(value, list):
        raise check.fail("contract", value, "a list of clauses such as {head: L0.H0, score: "
                         "previous_token, at_least: 0.9}")
    clauses = [check.mapping(c, f"contract[{i}]", "a clause mapping such as {head: L0.H0, "
                             "score: previous_token, at_least: 0.9}")
               for i, c in enumerate(value)]
    for i, clause in enumerate(clauses):
        _one(clause, f"contract[{i}]", config, tasks)
    _contradictions(clauses)
    return tuple(clauses)


def _one(clause: dict[str, Any], path: str, config: ModelConfig, tasks: tuple[str, ...]
         ) -> None:
    from headwise.analysis.contract import Contract

    for low, high in _BOUNDS:
        lo, hi = clause.get(low), clause.get(high)
        if (isinstance(lo, (int, float)) and isinstance(hi, (int, float))
                and not isinstance(lo, bool) and not isinstance(hi, bool) and lo > hi):
            raise SpecError(f"{path}: {low}={lo} > {high}={hi}; no value satisfies both")
    try:
        Contract.from_list([clause], config.n_layers, config.n_heads, list(tasks))
    except (HeadwiseError, ValueError) as e:
        text = str(e)
        for prefix in ("contract[0].", "contract[0]: ", "contract[0]", "contract: ",
                       "clause 0: ", "[0]: ", "[0]."):
            if text.startswith(prefix):
                text = text[len(prefix):]
                break
        sep = "" if text.startswith(("[", ".")) else (
            "." if text.split(":", 1)[0].isidentifier() else ": ")
        raise SpecError(f"{path}{sep}{text}") from None


def _key(clause: Mapping[str, Any]) -> tuple[Any, ...]:
    """What a clause measures, without its bounds (two clauses with one key bound one value)."""
    bounds = {k for pair in _BOUNDS for k in pair}
    return tuple(sorted((k, repr(v)) for k, v in clause.items() if k not in bounds))


def _contradictions(clauses: list[dict[str, Any]]) -> None:
    seen: dict[tuple[Any, ...], int] = {}
    for i, clause in enumerate(clauses):
        key = _key(clause)
        if key in seen:
            j = seen[key]
            for low, high in _BOUNDS:
                for a, b in ((clauses[j], clause), (clause, clauses[j])):
                    lo, hi = a.get(low), b.get(high)
                    if isinstance(lo, (int, float)) and isinstance(hi, (int, float)) and lo > hi:
                        raise SpecError(
                            f"contract[{i}]: contradicts contract[{j}] on the same measurement "
                            f"({low}={lo} > {high}={hi}); no model can satisfy both")
        seen.setdefault(key, i)
