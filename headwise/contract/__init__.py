"""Specialization contracts: clause kinds, parsing, verification, enforcement and forecasts.

One home per clause kind: each kind (``score``, ``ablation``, ``exclusive``, ``task``,
``preserve``) is one ``ClauseKind`` entry in ``headwise.contract.kinds.KINDS`` that parses,
describes, measures, levers and scores its clauses (docs/contracts.md); a clause reaches its
kind through ``clause.entry``. ``parse_contract`` turns YAML/JSON clauses into a ``Contract``;
``Contract.prepare`` readies a model for it; ``verify`` measures it; ``plan`` (a ``Plan``) and
``Enforcer`` enforce it as constrained training with the settings of an ``EnforceConfig``
(its ``dual`` update a ``DualUpdate`` strategy); ``ForecastWatch`` warns early about clauses a
role forecast says will fail.
"""

from headwise.contract.clause import METRICS, MODES, UNIT_METRICS, Clause, Contract, margin
from headwise.contract.enforce import Enforcer, Plan, check_possible, plan, summary
from headwise.contract.forecast import ClauseForecast, ForecastWatch, forecast_clauses
from headwise.contract.kind import ClauseKind
from headwise.contract.kinds import KINDS
from headwise.contract.lever import (
    ClauseLever,
    DualContext,
    DualUpdate,
    EnforceConfig,
    LeverKind,
    ProbeSampler,
    ProjectedAscent,
    RunStructure,
)
from headwise.contract.parse import parse_contract
from headwise.contract.record import EnforcementRecord
from headwise.contract.results import ClauseResult, ContractResult, VerifyData
from headwise.contract.task import did_not_learn, task_learned
from headwise.contract.verify import verify

__all__ = [
    "KINDS", "METRICS", "MODES", "UNIT_METRICS", "Clause", "ClauseForecast", "ClauseKind",
    "ClauseLever", "ClauseResult", "Contract", "ContractResult", "DualContext", "DualUpdate",
    "EnforceConfig", "EnforcementRecord", "Enforcer", "ForecastWatch", "LeverKind", "Plan",
    "ProbeSampler", "ProjectedAscent", "RunStructure", "VerifyData", "check_possible",
    "did_not_learn", "forecast_clauses", "margin", "parse_contract", "plan", "summary",
    "task_learned", "verify",
]
