"""The verification set's default size: large enough that a model meeting every clause at its
best attainable value is certified whole at the family-wise level. Checked against the closed
forms and against the bounds verification itself computes, one example short and at size."""

from __future__ import annotations

import math

import pytest
import torch

from headwise.confidence import difference_p, share_examples_if_perfect
from headwise.contract import ClauseResult, parse_contract
from headwise.contract.certify import paired_drop_bound, task_bound
from headwise.contract.clause import holds
from headwise.runspec import spec_from_dict


def _clause(raw: dict, tasks: list[str]) -> object:
    (c,) = parse_contract([raw], 2, 4, tasks)
    return c


def test_a_perfect_share_needs_log_alpha_over_log_threshold_examples() -> None:
    for side, t, level in (("at_least", 0.9, 0.05), ("at_most", 0.02, 0.01),
                           ("at_least", 0.5, 0.001)):
        n = share_examples_if_perfect(side, t, level)
        room = t if side == "at_least" else 1 - t
        assert n == math.ceil(math.log(level) / math.log(room))
    assert share_examples_if_perfect("at_least", 1.0, 0.05) is None
    assert share_examples_if_perfect("at_most", 0.0, 0.05) is None


@pytest.mark.parametrize("raw, level", [
    ({"task": "copy", "metric": "exact", "at_least": 0.9}, 0.05 / 3),
    ({"task": "copy", "metric": "accuracy", "at_most": 0.1}, 0.05),
])
def test_a_task_clause_at_its_best_is_certified_at_the_size_and_not_one_short(
        raw: dict, level: float) -> None:
    c = _clause(raw, ["copy"])
    (task, n), = c.entry.examples_if_perfect(c, level, ("copy",)).items()
    assert task == "copy"
    best = 1.0 if "at_least" in raw else 0.0
    for size, certified in ((n - 1, False), (n, True)):
        r = ClauseResult(c, True, best, c.threshold_text(), "the model")
        hits = torch.full((size,), best, dtype=torch.float64)
        b = task_bound(r, hits, torch.ones(size, dtype=torch.float64), 1 - level)
        assert b.certified is certified


def _paired(n: int, harmed: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    count = torch.ones(n, dtype=torch.float64)
    after = count.clone()
    after[:harmed] = 0.0
    return count.clone(), after, count


@pytest.mark.parametrize("raw", [
    {"ablate": "L0.H1", "task": "copy", "drop_at_most": 0.02},
    {"ablate": "L0.H1", "task": "copy", "drop_at_least": 0.4},
    {"ablate": "L0.H1", "task": "copy", "drop_at_least": 0.0},
])
def test_a_drop_at_its_best_is_certified_at_the_size_and_not_one_short(raw: dict) -> None:
    c = _clause(raw, ["copy"])
    level = 0.01
    n = c.entry.examples_if_perfect(c, level, ("copy",))["copy"]
    floor = "drop_at_least" in raw
    for size, certified in ((n - 1, False), (n, True)):
        paired = _paired(size, size if floor else 0)  # every example harmed, or none
        value = 1.0 if floor else 0.0
        r = ClauseResult(c, holds(value, c.at_least, c.at_most), value, c.threshold_text(),
                         "the model")
        assert paired_drop_bound(r, [paired], 1 - level).certified is certified
    if floor:
        assert difference_p(n, n, 0, n, raw["drop_at_least"]) <= level


def test_any_of_pays_its_bonferroni_factor_and_exclusive_sizes_every_task() -> None:
    one = _clause({"ablate": "L0.H1", "task": "copy", "drop_at_most": 0.05}, ["copy"])
    four = _clause({"any_of": "L0.*", "task": "copy", "drop_at_most": 0.05}, ["copy"])
    n1 = one.entry.examples_if_perfect(one, 0.05, ("copy",))["copy"]
    n4 = four.entry.examples_if_perfect(four, 0.05, ("copy",))["copy"]
    assert (n1, n4) == (share_examples_if_perfect("at_most", 0.05, 0.05),
                        share_examples_if_perfect("at_most", 0.05, 0.05 / 4))
    ex = _clause({"heads": "L0.H1", "tasks": ["sort"], "exclusive": True, "drop_at_least": 0.3,
                  "others_drop_at_most": 0.05}, ["copy", "sort"])
    sizes = ex.entry.examples_if_perfect(ex, 0.05, ("copy", "sort"))
    assert set(sizes) == {"copy", "sort"} and sizes["copy"] == n1
    loss = _clause({"task": "copy", "metric": "loss", "at_most": 0.5}, ["copy"])
    assert loss.entry.examples_if_perfect(loss, 0.05, ("copy",)) == {}  # the spread decides


def _spec(data: dict, contract: list) -> dict:
    return {"model": {"n_layers": 2, "n_heads": 4, "d_model": 32, "vocab_size": 16,
                      "max_seq_len": 16},
            "data": {"tasks": {"copy": {"length": 3}, "reverse": {"length": 3},
                               "sort": {"length": 3}}, "eval_examples": 256, **data},
            "contract": contract}


CONTRACT = [{"ablate": "L1.H3", "task": "sort", "drop_at_most": 0.02},
            {"task": "copy", "metric": "accuracy", "at_least": 0.9},
            {"task": "reverse", "metric": "accuracy", "at_least": 0.9},
            {"task": "sort", "metric": "accuracy", "at_least": 0.9},
            {"head": "L0.H0", "score": "previous_token", "at_least": 0.5}]


def test_the_default_verification_set_certifies_a_perfect_model_family_wise() -> None:
    """Five clauses, Holm's strictest level 0.01: the drop cap needs log(0.01) / log(0.98) =
    228 examples of sort, a third of the mixture: 684 in all."""
    spec = spec_from_dict(_spec({}, CONTRACT))
    assert spec.data.verify_examples == 3 * math.ceil(math.log(0.01) / math.log(0.98)) == 684
    assert spec.data.eval_examples == 256  # the enforcement set is the spec's
    given = spec_from_dict(_spec({"verify_examples": 300}, CONTRACT))
    assert given.data.verify_examples == 300  # a size the spec states is kept
    larger = spec_from_dict(_spec({"eval_examples": 1000}, CONTRACT))
    assert larger.data.verify_examples == 1000  # never below the enforcement set's
    weighted = _spec({}, CONTRACT)
    weighted["data"]["tasks"]["sort"]["weight"] = 2.0  # half the mixture
    assert spec_from_dict(weighted).data.verify_examples == 2 * 228
