"""Clause bounds: which bound each clause gets, certified / holds / fails, the contract's
family-wise level, and simulations in which the true value is known."""

from __future__ import annotations

import json
import math

import pytest
import torch
import yaml
from torch import Tensor

from headwise import ModelConfig, build_model
from headwise.analysis.importance_matrix import ratio_stderr
from headwise.confidence import (
    BOOTSTRAP_T,
    binomial_lower,
    binomial_p,
    binomial_upper,
    bootstrap_t,
    bootstrap_t_side,
    difference_lower,
    difference_p,
    t_cdf,
    t_quantile,
)
from headwise.contract import ClauseResult, ContractResult, VerifyData, parse_contract, verify
from headwise.contract.certify import (
    Paired,
    certify,
    drift_bound,
    kept_bound,
    paired_drop_bound,
    task_bound,
)
from headwise.contract.clause import holds
from headwise.contract.results import Bound
from headwise.data import IGNORE, Batch
from headwise.data.sequences import CopyTask
from headwise.pipeline import compile_spec
from headwise.pipeline.heldout import verification_data
from headwise.runspec import load_spec

NO_MODEL = torch.nn.Module()  # score bounds read no model


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
    assert r.bound.needed == need  # certified: the fewest examples that would certify it


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


def _outcomes(n: int, harmed: int, helped: int, positions: int = 1) -> Paired:
    """Per-example paired outcomes: the first ``harmed`` examples lose their right tokens, the
    next ``helped`` gain them, the rest stay right."""
    count = torch.full((n,), float(positions), dtype=torch.float64)
    clean, after = count.clone(), count.clone()
    after[:harmed] = 0.0
    clean[harmed:harmed + helped] = 0.0
    return clean, after, count


def _drop(clause: dict, paired: Paired) -> ClauseResult:
    clean, after, count = paired
    return _result(clause, float((clean - after).sum() / count.sum()))


def test_an_unchanged_ablation_is_bounded_by_the_share_that_could_change() -> None:
    """No example of 100 changed: the drop is at most the share harmed, at most 1 -
    0.05^(1/100) = 0.0295, short of a cap of 0.02, which needs log(0.05) / log(0.98) = 149
    examples."""
    paired = _outcomes(100, 0, 0, positions=3)
    r = _drop({"ablate": "L0.H0", "task": "copy", "drop_at_most": 0.02}, paired)
    b = paired_drop_bound(r, [paired], 0.95)
    assert b.upper == pytest.approx(1 - 0.05 ** (1 / 100))
    assert b.p_value == pytest.approx(0.98 ** 100) and not b.certified
    assert b.needed == math.ceil(math.log(0.05) / math.log(0.98))


def test_a_drop_cap_is_the_clopper_pearson_bound_on_the_share_harmed() -> None:
    """drop = harmed - helped <= harmed: 3 harmed and 5 helped of 200 against a cap of 0.05;
    the helped examples do not loosen it."""
    for helped in (0, 5):
        paired = _outcomes(200, 3, helped)
        r = _drop({"ablate": "L0.H0", "task": "copy", "drop_at_most": 0.05}, paired)
        b = paired_drop_bound(r, [paired], 0.95)
        assert b.method == "clopper-pearson (paired)" and "3 of 200 examples harmed" in b.note
        assert b.upper == pytest.approx(binomial_upper(3, 200, 0.95), abs=1e-12)
        assert b.p_value == pytest.approx(binomial_p(3, 200, 0.05, "at_most"), rel=1e-12)
        assert b.certified


def test_a_drop_floor_is_the_share_harmed_less_the_share_helped_at_half_the_level() -> None:
    paired = _outcomes(200, 70, 4)
    r = _drop({"ablate": "L0.H0", "task": "copy", "drop_at_least": 0.25}, paired)
    b = paired_drop_bound(r, [paired], 0.95)
    low = binomial_lower(70, 200, 0.975) - binomial_upper(4, 200, 0.975)
    assert b.lower == pytest.approx(low, abs=1e-12) and b.upper is None
    assert b.p_value == pytest.approx(difference_p(70, 200, 4, 200, 0.25), rel=1e-12)
    # the p-value is the level at which the bound meets the floor
    assert difference_lower(70, 200, 4, 200, 1 - b.p_value) == pytest.approx(0.25, abs=1e-9)
    assert b.certified == (low >= 0.25)
    # a negative floor: drop >= -(share helped), the helped share's bound at the full level
    r = _drop({"ablate": "L0.H0", "task": "copy", "drop_at_least": -0.1}, paired)
    b = paired_drop_bound(r, [paired], 0.95)
    assert b.lower == pytest.approx(-binomial_upper(4, 200, 0.95), abs=1e-12)
    assert b.p_value == pytest.approx(binomial_p(4, 200, 0.1, "at_most"), rel=1e-12)
    # a cap at 0 cannot be met by the share harmed alone: helped - harmed at half the level
    paired = _outcomes(200, 2, 40)
    r = _drop({"ablate": "L0.H0", "task": "copy", "drop_at_most": 0.0}, paired)
    b = paired_drop_bound(r, [paired], 0.95)
    assert b.upper == pytest.approx(-difference_lower(40, 200, 2, 200, 0.95), abs=1e-12)
    assert b.certified


def test_all_of_needs_every_head_and_any_of_is_bonferroni_over_heads() -> None:
    """Two heads: one harms 2 of 300 examples, the other 9; a cap of 0.04."""
    units = [_outcomes(300, 2, 0), _outcomes(300, 9, 0)]
    p = [binomial_p(k, 300, 0.04, "at_most") for k in (2, 9)]
    every = _drop({"all_of": "L0.H0-1", "task": "copy", "drop_at_most": 0.04}, units[1])
    b = paired_drop_bound(every, units, 0.95)
    assert b.p_value == pytest.approx(max(p)) and b.upper == pytest.approx(
        binomial_upper(9, 300, 0.95))
    assert "every one of 2 heads (intersection-union)" in b.note
    some = _drop({"any_of": "L0.H0-1", "task": "copy", "drop_at_most": 0.04}, units[0])
    b = paired_drop_bound(some, units, 0.95)
    assert b.p_value == pytest.approx(2 * min(p)) and b.upper == pytest.approx(
        binomial_upper(2, 300, 0.975))
    assert "Bonferroni over 2 heads" in b.note


def test_a_loss_drop_is_the_bootstrap_t_of_the_paired_changes() -> None:
    g = torch.Generator().manual_seed(3)
    n = 150
    clean = torch.rand(n, generator=g, dtype=torch.float64) * 3
    change = torch.rand(n, generator=g, dtype=torch.float64) * 0.2
    count = torch.ones(n, dtype=torch.float64)
    r = _result({"ablate": "L0.H0", "task": "copy", "metric": "loss", "drop_at_most": 0.12},
                float(change.mean()))
    b = paired_drop_bound(r, [(clean, clean + change, count)], 0.95)
    assert b.method == "bootstrap-t (paired)"
    t_star = bootstrap_t(change[None], count[None])[0]
    se = float(change.std() / math.sqrt(n))  # the ratio's se with unit counts: the mean's
    low_q = float(t_star.sort().values[int(0.05 * BOOTSTRAP_T)])
    assert b.upper == pytest.approx(float(change.mean()) - low_q * se, rel=1e-9)
    assert b.certified


def _kept_draw(n: int, seed: int, keep: float = 0.95) -> tuple[Tensor, Tensor, Tensor]:
    """Per example: the model right with chance 0.9, the empty circuit 0.2, the circuit right
    where the model is with chance ``keep``."""
    g = torch.Generator().manual_seed(seed)
    full = (torch.rand(n, generator=g) < 0.9).double()
    empty = (torch.rand(n, generator=g) < 0.2).double()
    circuit = full * (torch.rand(n, generator=g) < keep).double()
    return full, circuit, empty


def test_a_circuits_share_kept_of_an_accuracy_is_one_less_the_ratio_of_two_paired_drops(
        ) -> None:
    """``1 - U(D1) / L(D2)``: D1 the circuit's paired drop from the model (examples harmed
    less helped), D2 the empty circuit's, each bound ``L(h) - U(g)`` at ``1 - alpha / 2``, so
    every Clopper-Pearson bound at ``1 - alpha / 4``."""
    n = 300
    full, circuit, empty = _kept_draw(n, 4)
    kept = float((circuit - empty).sum() / (full - empty).sum())
    r = _result({"circuit": ["L0.H0"], "task": "copy", "keeps_at_least": 0.8}, kept)
    b = kept_bound(r, (full, circuit, empty, torch.ones(n, dtype=torch.float64)), 0.95)
    q = 1 - 0.05 / 4

    def counts(a: Tensor, b: Tensor) -> tuple[float, float]:
        return float((a > b).sum()), float((b > a).sum())

    h1, g1 = counts(full, circuit)
    h2, g2 = counts(full, empty)
    up1 = binomial_upper(h1, n, q) - binomial_lower(g1, n, q)
    low2 = binomial_lower(h2, n, q) - binomial_upper(g2, n, q)
    assert b.method == "clopper-pearson (ratio of drops)"
    assert b.lower == pytest.approx(1 - max(up1, 0) / low2, rel=1e-9) and b.lower < kept
    assert b.certified == (b.lower >= 0.8) and b.certified
    # The p-value is the level at which the bound reaches the floor.
    at_p = kept_bound(r, (full, circuit, empty, torch.ones(n, dtype=torch.float64)),
                      1 - b.p_value)
    assert at_p.lower == pytest.approx(0.8, abs=1e-6)


def test_a_circuit_that_keeps_every_example_is_certified_without_spread() -> None:
    """The circuit right exactly where the model is: the share kept is 1 on every example (no
    spread, so no bootstrap), yet 300 examples bound it near 1."""
    n = 300
    full, _, empty = _kept_draw(n, 5)
    r = _result({"circuit": ["L0.H0"], "task": "copy", "keeps_at_least": 0.9}, 1.0)
    b = kept_bound(r, (full, full.clone(), empty, torch.ones(n, dtype=torch.float64)), 0.95)
    q = 1 - 0.05 / 4
    h2, g2 = float((full > empty).sum()), float((empty > full).sum())
    low2 = binomial_lower(h2, n, q) - binomial_upper(g2, n, q)
    assert b.lower == pytest.approx(1 - binomial_upper(0, n, q) / low2, rel=1e-9)
    assert b.certified and 0.95 < b.lower < 1.0


def test_a_circuits_share_kept_of_a_loss_is_the_bootstrap_t_of_a_ratio() -> None:
    g = torch.Generator().manual_seed(4)
    n = 300
    full = torch.rand(n, generator=g, dtype=torch.float64)  # per-example losses
    empty = full + 2.0 + torch.rand(n, generator=g, dtype=torch.float64)
    circuit = full + 0.1 * torch.rand(n, generator=g, dtype=torch.float64)
    kept = float((circuit - empty).sum() / (full - empty).sum())
    r = _result({"circuit": ["L0.H0"], "task": "copy", "metric": "loss",
                 "keeps_at_least": 0.8}, kept)
    b = kept_bound(r, (full, circuit, empty, torch.ones(n, dtype=torch.float64)), 0.95)
    assert b.method == "bootstrap-t (ratio)" and b.lower is not None and b.lower < kept
    assert b.certified == (b.lower >= 0.8)


def test_role_drift_is_certified_when_every_head_and_role_is() -> None:
    """|change| <= 0.05 per head and role, both sides: the upper bound is the largest
    ``|change| + t se``; the p-value the smallest margin's."""
    r = _result({"preserve": "base", "metric": "role_drift", "at_most": 0.05}, 0.03)
    change = torch.tensor([[0.01, -0.03, math.nan], [0.0, 0.02, 0.005]], dtype=torch.float64)
    se = torch.tensor([[0.004, 0.006, 0.01], [0.002, 0.01, 0.001]], dtype=torch.float64)
    b = drift_bound(r, change, se, 16, 64, 0.95)
    q = t_quantile(0.95, 15)
    assert b.method == "student-t (intersection-union)"
    assert b.upper == pytest.approx(max(0.03 + q * 0.006, 0.02 + q * 0.01))
    assert b.p_value == pytest.approx(1 - t_cdf(min(0.02 / 0.006, 0.03 / 0.01), 15))
    assert b.certified == (b.upper is not None and b.upper <= 0.05)


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
    r = _result({"head": "L0.H0", "score": "previous_token", "at_least": 0.4}, 0.5)
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
DRAWS = 20_000


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
    assert _at_most_alpha(_bootstrap_wrong(losses, torch.ones_like(losses), 2.3, "at_most"),
                          draws)


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


def _paired_draws(draws: int, n: int, harmed: float, helped: float,
                  seed: int) -> tuple[Tensor, Tensor]:
    """Counts of examples harmed and helped in ``draws`` verification sets of ``n`` (each
    example harmed, helped or unchanged independently)."""
    u = torch.rand(draws, n, generator=torch.Generator().manual_seed(seed))
    return (u < harmed).sum(1), ((u >= harmed) & (u < harmed + helped)).sum(1)


def _wrong_rate(clause: dict, n: int, kh: Tensor, kg: Tensor) -> float:
    """The share of draws in which the clause holds and its paired drop bound certifies it
    (each distinct pair of counts bounded once)."""
    verdict: dict[tuple[int, int], bool] = {}
    for pair in set(zip(kh.tolist(), kg.tolist(), strict=True)):
        paired = _outcomes(n, *pair)
        r = _drop(clause, paired)
        verdict[pair] = r.passed and paired_drop_bound(r, [paired], 1 - ALPHA).certified
    return sum(verdict[p] for p in zip(kh.tolist(), kg.tolist(), strict=True)) / len(kh)


@pytest.mark.parametrize(("n", "harmed", "helped"), [(200, 0.02, 0.0), (512, 0.02, 0.0),
                                                     (512, 0.03, 0.01)])
def test_certified_drop_caps_met_by_rare_changes_are_wrong_at_most_alpha(
        n: int, harmed: float, helped: float) -> None:
    """A cap of 0.02 on the true drop (harmed - helped = 0.02, the hardest false claim), 2% or
    3% of examples harmed: over 20000 verification sets the paired bound certifies it at most
    5% of the time (the normal bound on the bootstrap standard error did so in 9-11%)."""
    kh, kg = _paired_draws(DRAWS, n, harmed, helped, seed=n)
    clause = {"ablate": "L0.H0", "task": "copy", "drop_at_most": 0.02}
    assert _at_most_alpha(_wrong_rate(clause, n, kh, kg), DRAWS)


def test_certified_drop_floors_are_wrong_at_most_alpha_and_true_ones_certify() -> None:
    """A floor of 0.3 on the true drop (32% harmed, 2% helped), 200 examples, 4000 sets; a
    drop of 0.45 against the same floor certifies in most."""
    draws, n = 4000, 200
    clause = {"ablate": "L0.H0", "task": "copy", "drop_at_least": 0.3}
    assert _at_most_alpha(_wrong_rate(clause, n, *_paired_draws(draws, n, 0.32, 0.02, 5)),
                          draws)
    kh, kg = _paired_draws(400, n, 0.47, 0.02, 6)
    assert _wrong_rate(clause, n, kh, kg) > 0.8  # here every certification is right


def test_certified_token_accuracy_drop_caps_are_wrong_at_most_alpha() -> None:
    """Five scored positions per example; 5% of examples harmed, each on Bin(5, 0.4) of its
    tokens: the true drop is 0.02, the cap. Over 1000 sets of 300 examples the effective-n
    bound on the share harmed certifies it at most 5% of the time."""
    g = torch.Generator().manual_seed(7)
    draws, n, m = 1000, 300, 5
    hit = torch.rand(draws, n, generator=g) < 0.05
    lost = (torch.rand(draws, n, m, generator=g) < 0.4).sum(-1).double() * hit
    count = torch.full((n,), float(m), dtype=torch.float64)
    wrong = 0
    for row in lost:
        r = _result({"ablate": "L0.H0", "task": "copy", "drop_at_most": 0.02},
                    float(row.sum()) / (n * m))
        wrong += r.passed and paired_drop_bound(r, [(count, count - row, count)],
                                                1 - ALPHA).certified
    assert _at_most_alpha(wrong / draws, draws)


def _bootstrap_wrong(num: Tensor, den: Tensor, threshold: float, side: str) -> float:
    """The share of rows (verification sets) whose ratio is past ``threshold`` and whose
    bootstrap-t p-value certifies it (``_bootstrap_sides``' computation, all rows at once)."""
    value = num.sum(1) / den.sum(1)
    se = torch.tensor([ratio_stderr(a, b) for a, b in zip(num, den, strict=True)])
    _, p = bootstrap_t_side(value, se, bootstrap_t(num, den), threshold, side, 1 - ALPHA)
    passed = value >= threshold if side == "at_least" else value <= threshold
    return float((passed & (p <= ALPHA)).double().mean())


def test_certified_loss_drop_caps_met_by_rare_large_changes_are_wrong_at_most_alpha() -> None:
    """Per-example loss changes 0 for 90% of examples and exponential (mean 1) for 10%: the
    true drop 0.1 is the cap. Over 1000 sets of 200 examples the paired bootstrap-t certifies
    it at most 5% of the time."""
    g = torch.Generator().manual_seed(8)
    draws, n = 1000, 200
    change = ((torch.rand(draws, n, generator=g) < 0.1).double()
              * -torch.log(torch.rand(draws, n, generator=g, dtype=torch.float64)))
    rate = _bootstrap_wrong(change, torch.ones_like(change), 0.1, "at_most")
    assert _at_most_alpha(rate, draws)


def _kept_certified(draws: int, keep: float, seed: int) -> float:
    """The share of ``draws`` verification sets of 200 examples whose share kept is certified
    past a floor of 0.85: the model right with chance 0.9, the empty circuit 0.3, the circuit
    right where the model is with chance ``keep`` (true share ``(0.9 keep - 0.3) / 0.6``)."""
    g = torch.Generator().manual_seed(seed)
    n = 200
    full = (torch.rand(draws, n, generator=g) < 0.9).double()
    empty = (torch.rand(draws, n, generator=g) < 0.3).double()
    circuit = full * (torch.rand(draws, n, generator=g) < keep).double()
    ones = torch.ones(n, dtype=torch.float64)
    certified = 0
    for f, c, e in zip(full, circuit, empty, strict=True):
        kept = float((c - e).sum() / (f - e).sum())
        r = _result({"circuit": ["L0.H0"], "task": "copy", "keeps_at_least": 0.85}, kept)
        certified += r.passed and kept_bound(r, (f, c, e, ones), 1 - ALPHA).certified
    return certified / draws


def test_certified_shares_kept_of_an_accuracy_are_wrong_at_most_alpha() -> None:
    """The floor at the true share 0.85 (keep 0.9): the bound from the two paired drops
    certifies it at most 5% of the time (150 sets); a true share of 0.955 (keep 0.97)
    certifies in most sets."""
    assert _at_most_alpha(_kept_certified(150, 0.9, 10), 150)
    assert _kept_certified(60, 0.97, 11) > 0.5


def test_certified_shares_kept_are_wrong_at_most_alpha() -> None:
    """Per example: the model right with chance 0.9, the empty circuit 0.3 (independently),
    the circuit right where the model is with chance 0.9: the true share kept is (0.81 - 0.3)
    / (0.9 - 0.3) = 0.85, the floor. Over 1000 sets of 200 examples the bootstrap-t of the
    ratio certifies it at most 5% of the time."""
    g = torch.Generator().manual_seed(9)
    draws, n = 1000, 200
    full = (torch.rand(draws, n, generator=g) < 0.9).double()
    empty = (torch.rand(draws, n, generator=g) < 0.3).double()
    circuit = full * (torch.rand(draws, n, generator=g) < 0.9).double()
    assert _at_most_alpha(_bootstrap_wrong(circuit - empty, full - empty, 0.85, "at_least"),
                          draws)


def test_certified_role_drift_caps_are_wrong_at_most_alpha() -> None:
    """Six heads by nine roles measured on 16 groups of sequences, the starting and the trained
    model's group scores correlated; one pair's true change is the cap 0.05, the others' 0.
    Over 2000 probes the intersection-union bound certifies the cap at most 5% of the time."""
    g = torch.Generator().manual_seed(10)
    draws, groups, pairs = 2000, 16, (6, 9)
    start = 0.5 + 0.04 * torch.randn(draws, groups, *pairs, generator=g, dtype=torch.float64)
    trained = start + 0.02 * torch.randn(draws, groups, *pairs, generator=g,
                                         dtype=torch.float64)
    trained[..., 0, 0] += 0.05
    se = start.std(1) / groups ** 0.5 + trained.std(1) / groups ** 0.5  # (draws, 6, 9)
    change = trained.mean(1) - start.mean(1)
    wrong = 0
    for d in range(draws):
        r = _result({"preserve": "base", "metric": "role_drift", "at_most": 0.05},
                    float(change[d].abs().max()))
        wrong += r.passed and drift_bound(r, change[d], se[d], groups, 64, 1 - ALPHA).certified
    assert _at_most_alpha(wrong / draws, draws)


def test_verify_bounds_drops_paths_circuits_exclusive_and_role_drift_clauses() -> None:
    """Each kind's bound on a tiny model; an exclusive clause's p-value is the largest of its
    parts', each the bound an ablation clause on that task gets."""
    spec = load_spec(yaml.safe_dump({
        "model": {"n_layers": 1, "n_heads": 3, "d_model": 24, "vocab_size": 12,
                  "max_seq_len": 10, "attn_only": True},
        "data": {"tasks": {"copy": {"length": 3}, "reverse": {"length": 3}},
                 "eval_examples": 48},
        "train": {"steps": 2, "batch_size": 8, "eval_every": 2},
        "contract": [
            {"heads": "L0.H0", "tasks": ["copy"], "exclusive": True, "drop_at_least": 0.01,
             "others_drop_at_most": 0.005},
            {"ablate": "L0.H0", "task": "copy", "drop_at_least": 0.01},
            {"ablate": "L0.H0", "task": "reverse", "drop_at_most": 0.005},
            {"path": "L0.H0 -> logits", "task": "copy", "metric": "loss", "mode": "zero",
             "drop_at_most": 5.0},
            {"circuit": ["L0.H0"], "task": "copy", "metric": "loss", "mode": "zero",
             "keeps_at_least": -100.0},
            {"preserve": "base", "metric": "role_drift", "at_most": 0.05}]}, sort_keys=False))
    compiled = compile_spec(spec)
    with torch.no_grad():  # an untrained head barely moves anything: make its output count
        compiled.model.blocks[0].attn.o_proj.weight.mul_(30.0)  # type: ignore[union-attr,operator]
    results = verify(compiled.model, spec.contract, verification_data(compiled)).results
    exclusive, floor, cap, path, circuit, drift = (r.bound for r in results)
    assert exclusive is not None and floor is not None and cap is not None
    assert exclusive.method == "intersection-union" and "clopper-pearson (paired" in exclusive.note
    assert exclusive.p_value == pytest.approx(max(floor.p_value or 1, cap.p_value or 1))
    assert (exclusive.lower, exclusive.upper) == (floor.lower, cap.upper)
    assert path is not None and path.method == "bootstrap-t (paired)"
    assert circuit is not None and circuit.method == "bootstrap-t (ratio)"
    assert drift is not None and drift.method == "student-t (intersection-union)"
    assert drift.upper is not None and drift.upper >= results[5].measured  # type: ignore[operator]
