"""Verify a contract on a model: measure every clause, give its value, threshold, confidence
bound and verdict.

Each kind measures its own clauses (``ClauseKind.measure_all``: score clauses on one probe
share a role-score pass); the results come back in clause order, each with its one-sided bound
at ``contract.confidence`` (``headwise.contract.certify``). Measurement per kind is described in
its module and in docs/contracts.md.
"""

from __future__ import annotations

import dataclasses

from torch import nn

from headwise.contract.certify import certify
from headwise.contract.clause import Clause, Contract
from headwise.contract.results import ContractResult, VerifyData
from headwise.model.eval_mode import eval_mode


def verify(model: nn.Module, contract: Contract, data: VerifyData,
           bounds: bool = True) -> ContractResult:
    """Measure every clause of ``contract`` on ``data`` (in eval mode; the mode is restored)
    and, with ``bounds``, bound it at ``contract.confidence`` (what training reads at its
    evaluation points, the enforcer and the forecasts, needs the values only).

    Raises:
        SpecError: a clause names a probe or task that ``data`` lacks.
    """
    with eval_mode(model):
        by_kind: dict[str, list[Clause]] = {}
        for c in contract:
            by_kind.setdefault(c.kind, []).append(c)
        results = {}
        for clauses in by_kind.values():
            results.update(clauses[0].entry.measure_all(model, clauses, data))
        if not bounds:
            return ContractResult([results[c.index] for c in contract], contract.confidence)
        return ContractResult([dataclasses.replace(
            results[c.index], bound=certify(results[c.index], model, data, contract.confidence))
            for c in contract], contract.confidence)
