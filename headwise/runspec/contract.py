"""Checking a spec's ``contract:`` list against the model's shape and the spec's task names.

Clause validation and the detection of contradictory clauses belong to
``headwise.runspec.clauses.contract_from_list`` (its errors start with ``contract[i]``);
this module checks the list's shape first so that every message names a field path.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import headwise.runspec.check as check
from headwise.config import ModelConfig
from headwise.errors import HeadwiseError, SpecError
from headwise.runspec.clauses import contract_from_list


def parse_contract(value: Any, config: ModelConfig, tasks: tuple[str, ...],
                   probes: Sequence[str] | None = None) -> tuple[Mapping[str, Any], ...]:
    """Validate ``contract:`` and return its clauses.

    Args:
        probes: the probe names score clauses may measure ``on`` (``None``: not checked).

    Raises:
        SpecError: not a list of mappings, a clause ``contract_from_list`` rejects, two
            clauses that contradict each other, or an ``on`` naming no probe.
    """
    if value is None:
        return ()
    if not isinstance(value, list):
        raise check.fail("contract", value, "a list of clauses such as {head: L0.H0, score: "
                         "previous_token, at_least: 0.9}")
    clauses = [check.mapping(c, f"contract[{i}]", "a clause mapping such as {head: L0.H0, "
                             "score: previous_token, at_least: 0.9}")
               for i, c in enumerate(value)]
    try:
        contract = contract_from_list(clauses, config.n_layers, config.n_heads, list(tasks))
    except HeadwiseError as e:
        raise SpecError(str(e)) from None
    for clause in contract:
        if probes is not None and clause.on is not None and clause.on not in probes:
            raise check.fail(f"{clause.path}.on", clause.on, f"one of the probes {list(probes)}"
                             " (declare others under probes:)")
    return tuple(clauses)
