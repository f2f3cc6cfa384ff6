"""The clause-kind registry: a new kind is one entry, the margin is one definition, and the
enforcement settings reach the levers."""

from __future__ import annotations

import math
from collections.abc import Mapping
from types import SimpleNamespace
from typing import Any

import pytest
import torch
from enforcer_points import trainer_state

from headwise import ModelConfig, build_model
from headwise.contract import (
    KINDS,
    Clause,
    ClauseKind,
    ClauseLever,
    ClauseResult,
    EnforceConfig,
    EnforcementRecord,
    Enforcer,
    LeverKind,
    RunStructure,
    VerifyData,
    margin,
    parse_contract,
    plan,
    verify,
)
from headwise.contract.clause import decide, holds
from headwise.contract.kind import ParseContext
from headwise.contract.lever import PlanContext
from headwise.errors import ConfigError
from headwise.heads import HeadSet
from headwise.pipeline import compile_spec
from headwise.runspec import load_spec


class ConstantKind(ClauseKind):
    """A kind defined outside the package: ``{constant: v, at_least: x}`` measures ``v``."""

    name = "constant"
    keys = frozenset({"constant", "at_least", "at_most", "name"})

    def claims(self, raw: Mapping[str, Any]) -> bool:
        return "constant" in raw

    def parse(self, path: str, index: int, raw: dict[str, Any], ctx: ParseContext) -> Clause:
        return Clause(index, self, "model", HeadSet([], ctx.n_layers, ctx.n_heads),
                      at_least=raw.get("at_least"), at_most=raw.get("at_most"),
                      name=raw.get("name"), source={**raw})

    def describe(self, clause: Clause) -> str:
        return f"the constant {clause.source['constant']}"

    def measured_on(self, clause: Clause) -> str:
        return "nothing"

    def measure(self, model: Any, clause: Clause, data: VerifyData) -> ClauseResult:
        v = float(clause.source["constant"])
        return ClauseResult(clause, holds(v, clause.at_least, clause.at_most), v,
                            clause.threshold_text())

    def lever(self, ctx: PlanContext, clause: Clause) -> ClauseLever | None:
        """A lever that trains nothing: an objective whose weight the multiplier sets."""
        return ClauseLever(LeverKind.PATTERN, "the constant's lever",
                           [ctx.add(_Weighted(), f"constant[{clause.path}]")])

    def prepare(self, model: Any, clauses: Any) -> None:
        self.prepared = [c.index for c in clauses]


class _Weighted:
    """An objective with no loss: only its weight (the multiplier's) is read."""

    name, weight = "", 0.0

    def prepare(self, *_: Any) -> None: ...

    def hooks(self) -> list[Any]:
        return []

    def loss(self, *_: Any) -> torch.Tensor:
        return torch.zeros(())

    def reset(self) -> None: ...


def test_a_new_kind_is_one_entry() -> None:
    with_constant = ConstantKind()
    kinds = {**KINDS, with_constant.name: with_constant}  # passed in: the registry is unchanged
    contract = parse_contract([{"constant": 0.5, "at_least": 0.4},
                               {"constant": 0.5, "at_least": 0.6, "name": "too high"},
                               {"task": "copy", "metric": "loss", "at_most": 100.0}],
                              n_layers=1, n_heads=2, tasks=["copy"], kinds=kinds)
    assert "constant" not in KINDS
    assert all(c.entry is kinds[c.kind] for c in contract)
    assert [c.kind for c in contract] == ["constant", "constant", "task"]
    assert contract[1].label == "too high" and contract[0].describe() == "the constant 0.5"
    model = build_model(ModelConfig(n_layers=1, n_heads=2, d_model=8, vocab_size=8,
                                    max_seq_len=6), seed=0)
    batch = type("B", (), {"tokens": torch.randint(0, 8, (4, 6)),
                           "targets": torch.randint(0, 8, (4, 6)), "attention_mask": None,
                           "task_ids": torch.zeros(4, dtype=torch.long)})()
    result = verify(model, contract, VerifyData(tasks={"copy": batch}))
    assert [r.passed for r in result.results] == [True, False, True]  # in clause order
    assert result.results[1].measured == 0.5 and result.exit_code == 1
    # The default violation is the negative margin: 0.6 - 0.5.
    assert with_constant.violation(result.results[1]) == pytest.approx(0.1)
    assert with_constant.violation(result.results[0]) == pytest.approx(-0.1)
    # The run prepares it, plans its lever and enforces it, all through ``clause.entry``.
    contract.prepare(model)
    assert with_constant.prepared == [0, 1]
    planned = plan(model, contract, RunStructure(("copy",)))
    lever = planned.levers[1]
    assert lever is not None and lever.objectives[0] in planned.objectives
    enforcer = Enforcer(contract, VerifyData(tasks={"copy": batch}), planned.levers)
    state = trainer_state(model, SimpleNamespace(steps=10, eval_every=5), step=5)
    enforcer(state)  # type: ignore[arg-type]
    record = EnforcementRecord.of(state.extra)
    eta = EnforceConfig().eta  # the failing clause's multiplier steps by eta x its violation
    assert record.multipliers[1] == pytest.approx(eta * 0.1)
    assert lever.objectives[0].weight == pytest.approx(eta * 0.1)
    assert record.multipliers[0] == 0.0 and not record.history[0].passed


def test_the_margin_is_the_distance_inside_the_bounds() -> None:
    assert margin(0.7, 0.5, None) == pytest.approx(0.2)
    assert margin(0.7, None, 0.6) == pytest.approx(-0.1)
    assert margin(0.55, 0.5, 0.6) == pytest.approx(0.05)  # the nearer bound decides
    assert margin(1.0, None, None) == math.inf and margin(math.nan, 0.0, None) == -math.inf
    assert holds(0.5, 0.5, 0.5) and not holds(math.nan, None, None)


def test_any_of_is_decided_by_the_best_unit_and_all_of_by_the_worst() -> None:
    def clause(quantifier: str) -> Clause:
        return parse_contract([{quantifier: "L0.*", "score": "self", "at_least": 0.5}],
                              n_layers=1, n_heads=3, tasks=[])[0]

    values = {"L0.H0": 0.2, "L0.H1": 0.9, "L0.H2": 0.6}
    assert decide(clause("any_of"), values) == (True, "L0.H1", 0.9)
    assert decide(clause("all_of"), values) == (False, "L0.H0", 0.2)


@pytest.mark.parametrize("field, value", [
    ("eta", 0.0), ("lambda_max", -1.0), ("p_max", 1.5), ("margin", 1.0), ("confidence", 0.3),
    ("confidence", 1.0),
    ("carrier_stages", (("margin",), ("others",))), ("carrier_stages", ()),
])
def test_enforce_config_refuses_values_out_of_range(field: str, value: Any) -> None:
    with pytest.raises(ConfigError, match=f"^{field}: got "):
        EnforceConfig(**{field: value})


SPEC = """
model: {n_layers: 1, n_heads: 3, d_model: 24, vocab_size: 16, max_seq_len: 12, attn_only: true}
data: {tasks: {copy: {length: 4}}}
contract:
  - {head: L0.H0, score: self, at_most: 0.3}
  - {ablate: L0.H1, task: copy, drop_at_least: 0.3}
"""


def test_plan_takes_its_settings_from_the_enforce_config() -> None:
    spec = load_spec(SPEC)
    config = EnforceConfig(p_max=0.4, ablation_scale=0.1, margin=0.1,
                           carrier_stages=(("others", "margin"),))
    compiled = compile_spec(spec)
    levers = plan(compiled.model, spec.contract, compiled.structure, config=config).levers
    bound = levers[0].objectives[0]  # type: ignore[union-attr]
    assert bound.max == pytest.approx(0.2)  # the bound lever aims 0.1 past at_most 0.3
    carrier = levers[1]
    assert carrier is not None and (carrier.scale, carrier.cap) == (0.1, 0.4)
    assert carrier.loss_from == 0.0  # one stage: the hinge acts from the start
    again = compile_spec(spec)
    staged = plan(again.model, spec.contract, again.structure).levers[1]  # default: two stages
    assert staged is not None and staged.loss_from == pytest.approx(0.5 / 0.15)


def test_the_spec_sets_enforcement_and_names_a_bad_field() -> None:
    from headwise.errors import SpecError

    spec = load_spec(SPEC + "enforce: {eta: 2, p_max: 0.4, carrier_stages: [[others, margin]]}\n")
    assert spec.enforce == EnforceConfig(eta=2.0, p_max=0.4,
                                         carrier_stages=(("others", "margin"),))
    assert load_spec(SPEC).enforce == EnforceConfig()
    with pytest.raises(SpecError, match=r"^enforce\.p_max: got 2, expected a probability"):
        load_spec(SPEC + "enforce: {p_max: 2}\n")
    with pytest.raises(SpecError, match=r"^enforce\.carrier_stages: got \[\['margin'\], "):
        load_spec(SPEC + "enforce: {carrier_stages: [[margin], [others]]}\n")
    with pytest.raises(SpecError, match=r"^enforce\.etta: unknown key"):
        load_spec(SPEC + "enforce: {etta: 2}\n")
