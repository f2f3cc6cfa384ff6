"""Multipliers that move between evaluation points: each batch's value of a clause, measured by
its lever, against the clause's own measurement; the dual step in the clause's room."""

from __future__ import annotations

import copy
import math
from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F

from headwise import ModelConfig, build_model
from headwise.analysis.roles import role_scores
from headwise.contract import EnforceConfig, plan
from headwise.contract.between import NAME, BatchDual
from headwise.contract.clause import Contract
from headwise.contract.lever import DualContext, ProjectedAscent, RunStructure, room
from headwise.contract.parse import parse_contract
from headwise.control.base_reference import base_of
from headwise.control.distill import mean_pool
from headwise.patterns import ROLE_NAMES
from headwise.training.evaluate import forward

ETA = EnforceConfig().eta_batch


def _planned(clauses: list[dict[str, object]], causal: bool = True,
             config: EnforceConfig | None = None) -> tuple[torch.nn.Module, Contract, object]:
    """A 2-layer, 3-head model (distinct sizes), its contract prepared and planned."""
    model = build_model(ModelConfig(n_layers=2, n_heads=3, d_model=12, vocab_size=13,
                                    max_seq_len=9, causal=causal), seed=0)
    contract = parse_contract(clauses, 2, 3, ["copy"])
    contract.prepare(model)
    planned = plan(model, contract, RunStructure(("copy",)), config=config or EnforceConfig())
    return model, contract, planned


def _batch(seed: int = 1) -> SimpleNamespace:
    g = torch.Generator().manual_seed(seed)
    tokens = torch.randint(0, 13, (5, 9), generator=g)
    mask = torch.ones(5, 9, dtype=torch.long)
    mask[3, 6:] = 0  # one padded row
    return SimpleNamespace(tokens=tokens, attention_mask=mask, task_ids=torch.zeros(5).long(),
                           targets=torch.where(mask.bool(), tokens, -100))


def _step(model: torch.nn.Module, planned: object, batch: SimpleNamespace) -> None:
    """One training forward of the planned objectives (what a training step runs)."""
    model.train()
    forward(model, model, batch, planned.objectives, False, torch.device("cpu"))  # type: ignore[attr-defined]


def test_rooms_are_what_each_bound_leaves_of_its_range() -> None:
    model, contract, planned = _planned([
        {"head": "L0.H1", "score": "previous_token", "at_least": 0.8},
        {"preserve": "base", "metric": "hidden_cosine", "at_least": 0.99},
        {"preserve": "base", "metric": "role_drift", "at_most": 0.05},
        {"preserve": "base", "metric": "kl", "at_most": 0.3},
        {"head": "L1.H2", "score": "self", "at_least": 1.0}], causal=False)
    levers = planned.levers  # type: ignore[attr-defined]
    units = [room(c, levers[c.index]) for c in contract]
    assert units[:4] == pytest.approx([0.2, 0.01, 0.05, 0.3]) and units[4] is None
    assert [levers[i].unit for i in range(4)] == pytest.approx([0.2, 0.01, 0.05, 0.3])
    assert levers[4].unit is None  # nothing left to aim past: evaluation points only
    # Each distillation lever weighs its clause on its bound as one unit at multiplier 1.
    assert [levers[i].scale for i in (1, 2, 3)] == pytest.approx([100.0, 200.0, 1 / 0.3])
    assert planned.objectives[-1].name == NAME  # type: ignore[attr-defined]


def test_a_batch_steps_a_score_clause_by_its_role_score_on_that_batch() -> None:
    model, contract, planned = _planned([
        {"head": "L0.H1", "score": "previous_token", "at_least": 0.9},
        {"all_of": "L1.H0-1", "score": "self", "at_least": 0.7}])
    batch = _batch()
    with torch.no_grad():  # the clause's own measurement of the same rows
        table = role_scores(model, batch.tokens, batch.attention_mask,
                            heads=["L0.H1", "L1.H0", "L1.H1"], roles=["previous_token", "self"])
    prev = table.get("L0.H1", "previous_token")
    worst_self = min(table.get("L1.H0", "self"), table.get("L1.H1", "self"))
    assert prev < 0.9 and worst_self < 0.7
    _step(model, planned, batch)
    levers = planned.levers  # type: ignore[attr-defined]
    lam = [levers[i].objectives[0].weight / levers[i].scale for i in (0, 1)]
    assert lam[0] == pytest.approx(ETA * (0.9 - prev) / 0.1, rel=1e-5)
    assert lam[1] == pytest.approx(ETA * (0.7 - worst_self) / 0.3, rel=1e-5)
    assert levers[1].objectives[0].weight == levers[1].objectives[1].weight  # one multiplier
    # Weighed in the clause's units: 1 / -log(bound), the cross-entropy at a score of the bound.
    assert [levers[i].scale for i in (0, 1)] == pytest.approx([1 / -math.log(0.9),
                                                               1 / -math.log(0.7)])
    # A second batch steps from there; the multiplier is capped at lambda_max.
    _step(model, planned, _batch(2))
    assert levers[0].objectives[0].weight / levers[0].scale > lam[0]


def test_a_batch_steps_a_bound_clause_by_its_role_score_on_that_batch() -> None:
    """A clause whose lever is a row-wise bound (an upper bound on a role, a bound on the
    entropy) steps on the batch's value too: the worst head's role score, measured here by
    ``role_scores`` on the same rows."""
    model, contract, planned = _planned([
        {"all_of": "L1.H0-1", "score": "first_token", "at_most": 0.1},
        {"head": "L0.H2", "score": "entropy", "at_most": 0.2}])
    levers = planned.levers  # type: ignore[attr-defined]
    assert [levers[i].kind.value for i in (0, 1)] == ["bound", "bound"]
    assert [levers[i].unit for i in (0, 1)] == pytest.approx([0.1, 0.2])
    batch = _batch()
    with torch.no_grad():
        table = role_scores(model, batch.tokens, batch.attention_mask,
                            heads=["L1.H0", "L1.H1", "L0.H2"], roles=["first_token", "entropy"])
    worst_first = max(table.get("L1.H0", "first_token"), table.get("L1.H1", "first_token"))
    entropy = table.get("L0.H2", "entropy")
    assert worst_first > 0.1 and entropy > 0.2
    _step(model, planned, batch)
    lam = [levers[i].objectives[0].weight / levers[i].scale for i in (0, 1)]
    assert lam[0] == pytest.approx(ETA * (worst_first - 0.1) / 0.1, rel=1e-5)
    assert lam[1] == pytest.approx(ETA * (entropy - 0.2) / 0.2, rel=1e-5)


def test_an_evaluation_forward_measures_and_moves_nothing() -> None:
    model, _, planned = _planned([{"head": "L0.H1", "score": "previous_token",
                                   "at_least": 0.9}])
    model.eval()
    forward(model, model, _batch(), planned.objectives, False, torch.device("cpu"))  # type: ignore[attr-defined]
    assert planned.levers[0].objectives[0].weight == 0.0  # type: ignore[attr-defined]


def test_eta_batch_zero_tracks_nothing() -> None:
    _, _, planned = _planned([{"head": "L0.H1", "score": "previous_token", "at_least": 0.9}],
                             config=EnforceConfig(eta_batch=0.0))
    assert planned.levers[0].unit is None  # type: ignore[attr-defined]
    assert all(o.name != NAME for o in planned.objectives)  # type: ignore[attr-defined]


def test_preserve_levers_measure_their_clause_from_the_first_step_at_weight_zero() -> None:
    """The cosine of the mean-pooled embeddings and the largest role-score change, on the
    batch, against a copy of the starting model measured independently; the terms stay 0 and
    carry no gradient until a multiplier weighs them."""
    model, _, planned = _planned([
        {"head": "L0.H1", "score": "previous_token", "at_least": 0.5},
        {"preserve": "base", "metric": "hidden_cosine", "at_least": 0.999},
        {"preserve": "base", "metric": "role_drift", "at_most": 0.001}], causal=False)
    start = copy.deepcopy(model)
    with torch.no_grad():
        for name, p in model.named_parameters():
            scale = 0.3 if ".attn.q" in name else 0.03 if "blocks.1.attn.v" in name else 0.0
            p.add_(torch.randn(p.shape, generator=torch.Generator().manual_seed(3)) * scale)
    batch = _batch()
    mask = batch.attention_mask
    with torch.no_grad():
        cos = F.cosine_similarity(mean_pool(start.hidden(batch.tokens, attention_mask=mask),
                                            mask.bool()),
                                  mean_pool(model.hidden(batch.tokens, attention_mask=mask),
                                            mask.bool()), dim=-1).mean()
        free = ["L0.H0", "L0.H2", "L1.H0", "L1.H1", "L1.H2"]
        roles = list(ROLE_NAMES)
        s0 = role_scores(start, batch.tokens, mask, heads=free, roles=roles).values
        s1 = role_scores(model, batch.tokens, mask, heads=free, roles=roles).values
        drift = torch.nan_to_num((s1 - s0).abs(), nan=0.0).max()
    levers = planned.levers  # type: ignore[attr-defined]
    cosine, pattern = levers[1].objectives[0], levers[2].objectives[0]
    assert base_of(model) is not None and cosine.weight == pattern.weight == 0.0
    model.train()
    _, terms = forward(model, model, batch, planned.objectives, False, torch.device("cpu"))  # type: ignore[attr-defined]
    for term, _ in terms[1:3]:
        assert float(term) == 0.0 and not term.requires_grad
    assert 0.9 < float(cos) < 0.999 and float(drift) > 0.002, (cos, drift)
    # Both clauses fail on the batch: their multipliers rose by eta_batch x violation / room,
    # the violation of the batch's value (read after the step, the values are gone: reset).
    assert cosine.batch_values() is None and pattern.batch_values() is None
    lam_cos = cosine.weight / levers[1].scale
    lam_drift = pattern.weight / levers[2].scale
    assert lam_cos == pytest.approx(ETA * (0.999 - float(cos)) / 0.001, rel=1e-4)
    assert lam_drift == pytest.approx(ETA * (float(drift) - 0.001) / 0.001, rel=1e-4)


def test_at_an_evaluation_point_a_tracked_clause_steps_at_its_own_rate() -> None:
    """``ProjectedAscent`` with ``rates``: ``clip(lambda + rate x v, 0, lambda_max)``, the
    default ``eta`` for the others."""
    lambdas = {0: 1.0, 1: 2.0}
    ctx = DualContext({0: None, 1: None}, frozenset(), frozenset(), 4.0, 16.0, {0: 5.0})
    ProjectedAscent().update(lambdas, {0: 0.3, 1: -0.1}, ctx)
    assert lambdas == pytest.approx({0: 1.0 + 5.0 * 0.3, 1: 2.0 - 4.0 * 0.1})


def test_the_batch_dual_logs_its_multipliers() -> None:
    model, _, planned = _planned([{"head": "L0.H1", "score": "previous_token",
                                   "at_least": 0.9}])
    dual = planned.objectives[-1]  # type: ignore[attr-defined]
    assert isinstance(dual, BatchDual)
    _step(model, planned, _batch())
    model.eval()
    _, logs = dual.loss(_batch().tokens)  # in eval mode: no step, the multiplier logged
    lever = planned.levers[0]  # type: ignore[attr-defined]
    assert set(logs) == {f"{NAME}/contract[0]"}
    assert float(logs[f"{NAME}/contract[0]"]) == pytest.approx(
        lever.objectives[0].weight / lever.scale) and lever.objectives[0].weight > 0
