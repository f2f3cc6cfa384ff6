"""Specialization contracts: clause kinds, parsing, verification, enforcement and forecasts.

One home per clause kind: each kind (``score``, ``ablation``, ``exclusive``, ``task``) is one
``ClauseKind`` entry in ``headwise.contract.kinds.KINDS`` that parses, describes, measures,
levers and scores its clauses (docs/contracts.md). ``parse_contract`` turns YAML/JSON clauses
into a ``Contract``; ``verify`` measures it; ``plan`` and ``Enforcer`` enforce it as
constrained training with the settings of an ``EnforceConfig``; ``ForecastWatch`` warns early
about clauses a role forecast says will fail.
"""

from headwise.contract.clause import METRICS, MODES, UNIT_METRICS, Clause, Contract, margin
from headwise.contract.enforce import Enforcer, check_possible, plan, summary
from headwise.contract.forecast import ClauseForecast, ForecastWatch, forecast_clauses
from headwise.contract.kind import ClauseKind
from headwise.contract.kinds import KINDS
from headwise.contract.lever import ClauseLever, EnforceConfig, ProbeSampler
from headwise.contract.parse import parse_contract
from headwise.contract.results import ClauseResult, ContractResult, VerifyData
from headwise.contract.verify import verify

__all__ = [
    "KINDS", "METRICS", "MODES", "UNIT_METRICS", "Clause", "ClauseForecast", "ClauseKind",
    "ClauseLever", "ClauseResult", "Contract", "ContractResult", "EnforceConfig", "Enforcer",
    "ForecastWatch", "ProbeSampler", "VerifyData", "check_possible",
    "forecast_clauses", "margin", "parse_contract", "plan", "summary", "verify",
]
