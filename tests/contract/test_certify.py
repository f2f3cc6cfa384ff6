"""Clause bounds: which bound each clause gets, certified / holds / fails, the contract's
family-wise level, and simulations in which the true value is known."""

from __future__ import annotations

import json
import math

import pytest
import torch

from headwise import ModelConfig, build_model
from headwise.confidence import binomial_lower, t_cdf, t_quantile
from headwise.contract import ClauseResult, ContractResult, VerifyData, parse_contract, verify
from headwise.contract.certify import certify, task_bound
from headwise.contract.clause import holds
from headwise.contract.results import Bound
from headwise.data import IGNORE, Batch
from headwise.data.sequences import CopyTask

NO_MODEL = torch.nn.Module()  # score, ablation and exclusive bounds read no model


def _result(clause: dict, value: float, stderr: float | None = None) -> ClauseResult:
    (c,) = parse_contract([clause], 2, 3, ["copy"])
    return ClauseResult(c, holds(value, c.at_least, c.at_most), value, c.threshold_text(),
                        "the model", stderr=stderr)


def _data(n: int, positions: int, rows: int = 0) -> VerifyData:
    targets = torch.full((n, 6), IGNORE)
    targets[:, :positions] = 1
    batch = Batch(torch.zeros(n, 6, dtype=torch.long), targets, None,
                  torch.zeros(n, dtype=torch.long))
    return VerifyData(tasks={"copy": batch},
                      probes={"default": torch.zeros(rows or n, 6, dtype=torch.long)})


def test_an_exact_match_floor_that_holds_but_is_not_certified() -> None:
    """46 of 50 examples right (0.92) against a floor of 0.9: the point estimate holds, the
    95% Clopper-Pearson bound (0.826) does not, and about 400 examples would certify it."""
    r = _result({"task": "copy", "metric": "exact", "at_least": 0.9}, 46 / 50)
    b = task_bound(r, (torch.arange(50) >= 4).double(), torch.ones(50).double(), 0.95)
    assert b.method == "clopper-pearson" and b.examples == 50
    assert b.lower == pytest.approx(binomial_lower(46, 50, 0.95), abs=1e-12)
    assert b.lower is not None and b.lower < 0.9 and b.upper is None
    r.bound = b
    assert r.passed and r.state == "holds"
    assert b.needed is not None and 50 < b.needed
    k = round(0.92 * b.needed)
    assert binomial_lower(k, b.needed, 0.95) >= 0.9  # the stated size does certify it
    (line,) = ContractResult([r]).evidence()
    assert "contract[0] holds but is not certified at 95%" in line
    assert f"about {b.needed} examples" in line


def test_every_example_right_is_certified_from_log_alpha_over_log_threshold_examples() -> None:
    need = math.ceil(math.log(0.05) / math.log(0.9))  # 29
    for n, state in ((need - 1, "holds"), (need, "certified")):
        r = _result({"task": "copy", "metric": "accuracy", "at_least": 0.9}, 1.0, 0.0)
        ones = torch.ones(n).double()  # one scored position, right: exact over examples
        r.bound = task_bound(r, ones, ones, 0.95)
        assert r.bound.method == "clopper-pearson"
        assert r.bound.lower == pytest.approx(0.05 ** (1 / n))
        assert r.state == state
    assert r.bound.needed is None  # certified: nothing more needed


def test_token_accuracy_over_several_positions_uses_the_effective_sample_size() -> None:
    """Examples right or wrong throughout (5 positions each): the token accuracy is the share of
    examples right, and the cluster variance ``p (1 - p) / (n - 1)`` gives ``n* = n - 1``."""
    n, right = 200, 180
    hits = (torch.arange(n) < right).double() * 5
    r = _result({"task": "copy", "metric": "accuracy", "at_least": 0.8}, right / n)
    b = task_bound(r, hits, torch.full((n,), 5.0, dtype=torch.float64), 0.95)
    assert b.method == "clopper-pearson (effective n)" and "199.0" in b.note
    assert b.lower == pytest.approx(binomial_lower(0.9 * (n - 1), n - 1, 0.95), abs=1e-9)
    # tokens that vary independently within examples never count for more than the positions
    g = torch.Generator().manual_seed(0)
    hits = torch.tensor([5.0, 0.0]).repeat(n // 2) + (torch.rand(n, generator=g) - 0.5) * 1e-9
    r = _result({"task": "copy", "metric": "accuracy", "at_least": 0.4}, float(hits.sum()) / 1000)
    b = task_bound(r, hits.double(), torch.full((n,), 5.0, dtype=torch.float64), 0.95)
    assert "effective sample size 199" in b.note  # not the 1000 positions


def test_an_unchanged_ablation_is_bounded_by_the_share_that_could_change() -> None:
    """No example of 100 changed: the drop is at most 1 - 0.05^(1/100) = 0.0295, short of a
    cap of 0.02, which needs log(0.05) / log(0.98) = 149 examples."""
    r = _result({"ablate": "L0.H0", "task": "copy", "drop_at_most": 0.02}, 0.0, 0.0)
    b = certify(r, NO_MODEL, _data(100, 3), 0.95)
    assert b.upper == pytest.approx(1 - 0.05 ** (1 / 100))
    assert b.p_value == pytest.approx(0.98 ** 100) and not b.certified
    assert b.needed == math.ceil(math.log(0.05) / math.log(0.98))


def test_a_two_sided_clause_needs_both_bounds_and_takes_the_larger_p_value() -> None:
    q = t_quantile(0.95, 15)
    for se, certified in ((0.02, True), (0.04, False)):  # upper 0.785 / 0.820 against 0.8
        r = _result({"head": "L0.H0", "score": "entropy", "at_least": 0.2, "at_most": 0.8},
                    0.75, se)
        b = certify(r, NO_MODEL, _data(64, 1), 0.95)
        assert b.method == "student-t"
        assert (b.lower, b.upper) == pytest.approx((0.75 - q * se, 0.75 + q * se))
        assert b.p_value == pytest.approx(1 - t_cdf(0.05 / se, 15))  # the upper side decides
        assert b.certified == certified == (b.upper is not None and b.upper <= 0.8)


def test_an_any_of_bound_is_bonferroni_over_its_heads() -> None:
    r = _result({"any_of": "L0.*", "score": "previous_token", "at_least": 0.9}, 0.95, 0.02)
    b = certify(r, NO_MODEL, _data(64, 1), 0.95)
    q = t_quantile(1 - 0.05 / 3, 15)
    assert b.lower == pytest.approx(0.95 - q * 0.02)
    assert "Bonferroni over 3 heads" in b.note


def test_clauses_without_a_standard_error_are_never_certified() -> None:
    (c,) = parse_contract([{"heads": "L0.H0", "tasks": ["copy"], "exclusive": True}], 2, 3,
                          ["copy"])
    r = ClauseResult(c, True, 0.5, c.threshold_text(), "L0.H0")
    r.bound = certify(r, NO_MODEL, _data(10, 1), 0.95)
    assert r.bound.method == "none" and r.state == "holds"
    assert "cannot be certified" in ContractResult([r]).evidence()[0]


def _bounded(p: float) -> ClauseResult:
    r = _result({"task": "copy", "metric": "loss", "at_most": 3.0}, 2.0, 0.1)
    r.bound = Bound("normal", 0.95, upper=2.2, p_value=p, examples=100)
    return r


def test_the_contracts_family_wise_level_is_holms() -> None:
    result = ContractResult([_bounded(p) for p in (0.01, 0.04, 0.03, 0.005)])
    assert [r.state for r in result.results] == ["certified"] * 4  # each at 95%
    assert result.family_p == pytest.approx([0.03, 0.06, 0.06, 0.02])
    assert not result.certified and result.family_level == pytest.approx(0.94)
    assert result.exit_for("holds") == 0 and result.exit_for("certified") == 1
    assert "not every clause certified at family-wise 95% (Holm; reached 94.0%)" in \
        result.headline()
    strong = ContractResult([_bounded(p) for p in (0.01, 0.012, 0.011, 0.005)])
    assert strong.certified and strong.exit_for("certified") == 0  # 0.005x4, 0.01x3, ...
    with pytest.raises(ValueError, match="require"):
        strong.exit_for("proven")


def test_the_verdict_with_bounds_reads_back_from_json() -> None:
    contract = parse_contract([{"task": "copy", "metric": "loss", "at_most": 3.0}], 2, 3, ["copy"])
    result = ContractResult([_bounded(0.01)], 0.9)
    written = json.loads(json.dumps(result.to_dict()))
    assert written["clauses"][0]["state"] == "certified" and written["certified"]
    back = ContractResult.from_dict(written, contract, "contract.json")
    assert back.confidence == 0.9 and back.results[0].bound == result.results[0].bound
    del written["clauses"][0]["bound"], written["confidence"]  # written before bounds
    old = ContractResult.from_dict(written, contract, "contract.json")
    assert old.results[0].state == "holds" and not old.certified
    written["clauses"][0]["bound"] = {"method": "normal"}
    with pytest.raises(Exception, match=r"clauses\[0\]\.bound\.confidence: expected a number"):
        ContractResult.from_dict(written, contract, "contract.json")


def test_verify_bounds_every_clause_at_the_contracts_confidence() -> None:
    torch.manual_seed(0)
    model = build_model(ModelConfig(n_layers=2, n_heads=3, d_model=24, d_head=8, d_ff=32,
                                    vocab_size=16, max_seq_len=16))
    batch = CopyTask(length=3, vocab_size=12).sample(80, torch.Generator().manual_seed(0))
    data = VerifyData(tasks={"copy": batch}, probes={"default": batch.tokens})
    loose = parse_contract([{"task": "copy", "metric": "loss", "at_most": 10.0},
                            {"head": "L0.H0", "score": "previous_token", "at_most": 0.99}],
                           2, 3, ["copy"])
    result = verify(model, loose, data)
    assert [r.state for r in result.results] == ["certified", "certified"]
    assert result.certified and result.confidence == 0.95
    value = result.results[0].measured
    assert value is not None
    tight = parse_contract([{"task": "copy", "metric": "loss", "at_most": value + 1e-4}], 2, 3,
                           ["copy"])
    (r,) = verify(model, tight, data).results
    assert r.passed and r.state == "holds" and r.bound is not None
    assert r.bound.method == "bootstrap-t" and r.bound.needed is not None
    assert r.bound.needed > 80


ALPHA = 0.05


def _at_most_alpha(rate: float, draws: int) -> bool:
    """At most alpha, up to 3 Monte-Carlo standard errors."""
    return rate <= ALPHA + 3 * math.sqrt(ALPHA * (1 - ALPHA) / draws)


def test_certified_token_accuracy_floors_are_wrong_at_most_alpha_of_the_time() -> None:
    """Examples of 5 scored positions whose per-example accuracy varies (Beta(9, 1), mean 0.9):
    the floor sits on the true token accuracy. Over 1500 verification sets of 100 examples, the
    effective-n Clopper-Pearson bound certifies the false floor in at most 5% of them."""
    g = torch.Generator().manual_seed(0)
    draws, n, m = 1500, 100, 5
    torch.manual_seed(0)
    p = torch.distributions.Beta(9.0, 1.0).sample((draws, n))  # (draws, n) per-example rate
    right = (torch.rand(draws, n, m, generator=g) < p[..., None]).sum(-1).double()
    count = torch.full((n,), float(m), dtype=torch.float64)
    wrong = 0
    for row in right:
        r = _result({"task": "copy", "metric": "accuracy", "at_least": 0.9},
                    float(row.sum() / (n * m)))
        wrong += r.passed and task_bound(r, row, count, 1 - ALPHA).certified
    assert _at_most_alpha(wrong / draws, draws)


def test_certified_loss_caps_are_wrong_at_most_alpha_of_the_time() -> None:
    """Per-example losses exponential with mean 2.3 (skewed; a normal bound certifies this
    false cap about 7% of the time at this size), the cap on the truth: over 2000 verification
    sets of 200 examples the studentised bootstrap certifies it at most 5% of the time."""
    g = torch.Generator().manual_seed(1)
    draws, n = 2000, 200
    losses = -2.3 * torch.log(torch.rand(draws, n, generator=g, dtype=torch.float64))
    count = torch.ones(n, dtype=torch.float64)
    wrong = 0
    for row in losses:
        r = _result({"task": "copy", "metric": "loss", "at_most": 2.3}, float(row.mean()))
        wrong += r.passed and task_bound(r, row, count, 1 - ALPHA).certified
    assert _at_most_alpha(wrong / draws, draws)


def test_the_worked_example_in_the_docs() -> None:
    """docs/contracts.md, "Confidence": the numbers quoted there."""
    contract = parse_contract([{"task": "copy", "metric": "exact", "at_least": 0.9},
                               {"head": "L0.H1", "score": "previous_token", "at_least": 0.9},
                               {"task": "copy", "metric": "accuracy", "at_least": 0.95}],
                              2, 3, ["copy"])
    exact = ClauseResult(contract[0], True, 184 / 200, ">= 0.9", "the model")
    exact.bound = task_bound(exact, (torch.arange(200) >= 16).double(),
                             torch.ones(200, dtype=torch.float64), 0.95)
    score = ClauseResult(contract[1], True, 0.93, ">= 0.9", "L0.H1", stderr=0.012)
    score.bound = certify(score, NO_MODEL, _data(64, 1), 0.95)
    accuracy = ClauseResult(contract[2], True, 197 / 200, ">= 0.95", "the model")
    accuracy.bound = task_bound(accuracy, (torch.arange(200) >= 3).double(),
                                torch.ones(200, dtype=torch.float64), 0.95)
    result = ContractResult([exact, score, accuracy])
    bounds = [r.bound for r in result.results]
    assert [round(b.lower, 3) for b in bounds if b and b.lower] == [0.881, 0.909, 0.962]
    assert [round(b.p_value, 4) for b in bounds if b and b.p_value] == [0.2075, 0.0123, 0.0090]
    assert [round(p, 4) for p in result.family_p] == [0.2075, 0.0271, 0.0271]
    assert [r.state for r in result.results] == ["holds", "certified", "certified"]
    assert round(100 * result.family_level, 1) == 79.3 and not result.certified
    assert bounds[0] is not None and bounds[0].needed == 638
