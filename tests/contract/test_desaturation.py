"""A task floor's desaturation: an entropy floor that sits out every step until the enforcer
switches it on (a failing floor whose task learned nothing while a head is saturated where the
answers are read), measured against explicit entropies, and the saddle it takes modular
addition off."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
from enforcer_points import enforcement_points

from headwise.cli import main
from headwise.contract import EnforceConfig, Enforcer, plan
from headwise.contract.results import ClauseResult, ContractResult
from headwise.contract.task import DESATURATION_FLOOR
from headwise.control.objectives import Desaturation, EntropyBound
from headwise.data.algorithmic import ModularAdditionTask
from headwise.pipeline import compile_spec
from headwise.pipeline.heldout import enforcement_data
from headwise.runspec import load_spec
from headwise.training.evaluate import forward

SPEC = """
model: {n_layers: 1, n_heads: 4, d_model: 32, vocab_size: 12, max_seq_len: 5}
data: {tasks: {modular_addition: {modulus: 7}}, eval_examples: 64}
train: {steps: 25, batch_size: 16, eval_every: 5}
contract:
  - {head: L0.H0, score: self, at_least: 0.5}
  - {task: modular_addition, metric: exact, at_least: 0.95}
"""


def _compiled():  # type: ignore[no-untyped-def]
    spec = load_spec(SPEC)
    return spec, compile_spec(spec)


def _batch(n: int = 32):  # type: ignore[no-untyped-def]
    return ModularAdditionTask(vocab_size=12, modulus=7).sample(n, torch.Generator().manual_seed(0))


def test_idle_it_attaches_no_hook_and_adds_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    _, compiled = _compiled()
    model, batch = compiled.model, _batch()
    obj = Desaturation(model, "L0.*", min=0.3, weight=0.0)
    monkeypatch.setattr(obj, "hooks", lambda: pytest.fail("an idle lever's hooks were made"))
    monkeypatch.setattr(obj, "prepare", lambda *a: pytest.fail("an idle lever was prepared"))
    with torch.no_grad():
        logits, terms = forward(model, model, batch, [obj], False, torch.device("cpu"))
        alone, _ = forward(model, model, batch, [], False, torch.device("cpu"))
    assert torch.equal(logits, alone)
    assert float(terms[0][0]) == 0.0 and terms[0][1] == {}


def test_weighted_it_is_the_entropy_bound_on_the_same_heads() -> None:
    _, compiled = _compiled()
    model, batch = compiled.model, _batch()
    values = []
    for obj in (Desaturation(model, "L0.H1-3", min=1.0, weight=2.0),  # below 1: every row
                EntropyBound(model, "L0.H1-3", min=1.0, weight=2.0)):
        _, terms = forward(model, model, batch, [obj], False, torch.device("cpu"))
        values.append(terms[0][0].detach())
    assert float(values[0]) > 0.0
    assert torch.equal(values[0], values[1])


def test_lowest_is_the_least_mean_entropy_where_the_answers_are_read() -> None:
    _, compiled = _compiled()
    model, batch = compiled.model, _batch()
    with torch.no_grad():
        _, cache = model.run_with_cache(batch.tokens)
    P = cache["blocks.0.attn.hook_pattern"][:, :, -1, :].double()  # (B, h, keys): row of `=`
    entropy = -(P * P.clamp_min(1e-30).log()).sum(-1) / math.log(5)  # five keys, causal
    expected = float(entropy.mean(0).min())
    assert Desaturation(model, "L0.*", min=0.3).lowest(model, batch) == pytest.approx(
        expected, abs=1e-6)


def _result(clause, value: float, low: float, high: float) -> ClauseResult:  # type: ignore[no-untyped-def]
    return ClauseResult(clause, value >= 0.95, value, ">= 0.95", "the model", ci=(low, high),
                        details={"examples": 64, "input_blind": 0.16})


def test_it_switches_on_once_while_the_task_learns_nothing_and_a_head_is_saturated(
        monkeypatch: pytest.MonkeyPatch) -> None:
    spec, compiled = _compiled()
    levers = plan(compiled.model, spec.contract, compiled.structure).levers
    floor = levers[1]
    assert floor is not None and len(floor.desaturation) == 1
    obj = floor.desaturation[0]
    # every head but L0.H0, whose pattern the score clause asks for
    assert [str(h) for h in obj.heads] == ["L0.H1", "L0.H2", "L0.H3"]
    assert obj.min == DESATURATION_FLOOR and obj.weight == 0.0 and obj.idle
    assert f"an entropy floor ({DESATURATION_FLOOR:g})" in floor.description
    lowest = iter([0.5, 0.05])  # not saturated, then saturated
    monkeypatch.setattr(obj, "lowest", lambda model, batch: next(lowest))
    # (value, 95% interval): chance with an interval over the input-blind 0.16 only at step 20
    sums = iter([(0.15, 0.10, 0.20), (0.16, 0.11, 0.21), (0.15, 0.10, 0.20),
                 (0.40, 0.30, 0.50), (0.15, 0.10, 0.20)])

    class Canned(Enforcer):
        def measure(self, state: object) -> ContractResult:
            return ContractResult([
                ClauseResult(spec.contract[0], True, 0.9, ">= 0.5", "L0.H0"),
                _result(spec.contract[1], *next(sums))])

    config = EnforceConfig()
    enforcer = Canned(spec.contract, enforcement_data(compiled), levers, config)
    points = enforcement_points(enforcer, compiled.model, spec.train, (5, 10, 15, 20, 25),
                                lambda state: (obj.weight, floor.objectives[0].weight,
                                               state.extra["enforce"]))
    weights = [w for w, _, _ in points]
    task_weights = [t for _, t, _ in points]
    # step 5: no head saturated; 10: saturated, on (weighted like the task's loss); 15: on
    # without measuring again; 20: the task learned, off for good; 25: at chance and (were it
    # measured) saturated again, but a run switches it on once only
    assert weights[0] == 0.0 and weights[3:] == [0.0, 0.0]
    assert weights[1:3] == pytest.approx([config.assist_weight * (1.0 + w)
                                          for w in task_weights[1:3]])
    assert points[-1][2]["desaturated"] == {"1": [10, 20]}


def test_enforcement_takes_modular_addition_off_its_saddle(tmp_path: Path) -> None:
    """Seed 2 of the suite's modular-addition spec: trained plainly, every head puts its
    attention on `=` itself by step 40 and the sums stay at chance (docs/benchmarks.md);
    enforced, the floor's desaturation switches on, the sums learn, and it switches off."""
    spec = Path(__file__).resolve().parents[2] / "headwise/examples/suite/modadd_carriers.yaml"
    for mode in ("plain", "enforced"):
        out = tmp_path / mode
        args = ["train", str(spec), "--seed", "2", "--out", str(out), "--quiet"]
        assert main(args + (["--enforce"] if mode == "enforced" else [])) == (
            1 if mode == "plain" else 0)
        sums = json.loads((out / "contract.json").read_text())["clauses"][1]
        assert sums["state"] == ("fails" if mode == "plain" else "certified"), sums
    plain = json.loads((tmp_path / "plain" / "contract.json").read_text())["clauses"][1]
    assert plain["measured"] < 0.2  # at chance: 1 in 7
    span = json.loads((tmp_path / "enforced" / "enforcement.json").read_text())["desaturated"]
    assert span["1"]["to"] is not None  # off again once the sums learned
