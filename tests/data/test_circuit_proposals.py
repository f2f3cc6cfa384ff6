"""Circuit proposals: shares of hand-built targets known by construction, and a loop reference."""

from __future__ import annotations

import pytest
import torch

from headwise.data import IGNORE, Batch, build_task
from headwise.data.circuit_proposals import (
    MIN_SHARE,
    NAMES,
    CircuitShare,
    circuit_roles,
    propose,
    rank_circuits,
)


def batch(tokens: list[list[int]], targets: list[list[int]],
          mask: list[list[int]] | None = None) -> Batch:
    t = torch.tensor(tokens)
    return Batch(t, torch.tensor(targets), None if mask is None else torch.tensor(mask),
                 torch.zeros(t.shape[0], dtype=torch.long))


def shares(b: Batch) -> dict[str, CircuitShare]:
    return {c.name: c for c in rank_circuits(b)}


def lookup_rows(n_explained: int, n_other: int) -> Batch:
    """``[a, 1, b, 2, c, 3, Q, a]`` rows (distinct ids): the target at the queried key is its
    value (explained by induction) in ``n_explained`` rows and an unseen id in the others. The
    first key is queried, so no fixed offset up to 4 reaches its value."""
    tokens, targets = [], []
    for i in range(n_explained + n_other):
        keys = [10 + (i + j) % 7 for j in range(3)]
        values = [20 + (i + 17 * j) % 60 for j in range(3)]
        q = 0
        tokens.append([keys[0], values[0], keys[1], values[1], keys[2], values[2], 3, keys[q]])
        answer = values[q] if i < n_explained else 99
        targets.append([IGNORE] * 7 + [answer])
    return batch(tokens, targets)


def test_induction_explains_the_targets_that_follow_the_earlier_occurrence() -> None:
    s = shares(lookup_rows(3, 1))
    assert s["induction"].share == 0.75
    assert s["induction"].targets == 4
    assert s["induction"].roles == (("previous_token", 0), ("induction", 1))
    assert rank_circuits(lookup_rows(3, 1))[0].name == "induction"
    for name in ("offset_1", "offset_2", "offset_3", "offset_4", "first_token"):
        assert s[name].share == 0.0  # the value is never 1-4 back, nor first


def test_fixed_offsets_and_their_previous_token_chains() -> None:
    # Distinct tokens (no induction key): the target at t is x[t - 2] at positions 2..5.
    tokens = [[10, 11, 12, 13, 14, 15], [20, 21, 22, 23, 24, 25]]
    targets = [[IGNORE, IGNORE, 10, 11, 12, 13], [IGNORE, IGNORE, 20, 21, 22, 99]]
    ranked = rank_circuits(batch(tokens, targets))
    assert ranked[0].name == "offset_2"
    assert ranked[0].share == 7 / 8
    assert ranked[0].roles == (("previous_token", 0), ("previous_token", 1))
    assert ranked[0].layers == 2
    assert shares(batch(tokens, targets))["induction"].share == 0.0
    assert circuit_roles("offset_1") == (("previous_token", 0),)


def test_first_token_copying_and_the_first_position_itself() -> None:
    # Targets equal the first token at t = 1, 2 (explained) and at t = 0 (the first
    # position: the role's rows exclude it, so it is not explained).
    b = batch([[7, 8, 9], [6, 5, 4]], [[7, 7, 7], [IGNORE, 6, 6]])
    s = shares(b)
    assert s["first_token"].share == 4 / 5
    assert s["first_token"].roles == (("first_token", 0),)


def test_chance_is_the_expected_agreement_under_independence() -> None:
    # offset_1 predicts x[0] at t = 1; targets 5, 5, 6, 7; predictions 5, 6, none (x[0] is
    # padding), 5. p(5) = 1/2, p(6) = 1/4: chance = (1/2 + 1/4 + 0 + 1/2) / 4.
    b = batch([[5, 100], [6, 101], [5, 102], [5, 103]],
              [[IGNORE, 5], [IGNORE, 5], [IGNORE, 6], [IGNORE, 7]],
              mask=[[1, 1], [1, 1], [0, 1], [1, 1]])
    c = shares(b)["offset_1"]
    assert c.share == 1 / 4
    assert c.chance == pytest.approx(0.3125)
    assert c.kappa == pytest.approx((0.25 - 0.3125) / 0.6875)
    assert not c.clear


def test_the_proposal_needs_a_clear_majority() -> None:
    n = 100
    explained = round(MIN_SHARE * n)
    assert propose(rank_circuits(lookup_rows(explained, n - explained))).name == "induction"
    assert propose(rank_circuits(lookup_rows(explained - 1, n - explained + 1))) is None


def test_a_rule_that_agrees_only_with_constant_targets_is_not_proposed() -> None:
    # Every target and every previous token is 9: share 1, chance 1, kappa 0.
    b = batch([[9, 9, 9]] * 4, [[IGNORE, 9, 9]] * 4)
    c = shares(b)["offset_1"]
    assert (c.share, c.chance, c.kappa) == (1.0, 1.0, 0.0)
    assert propose(rank_circuits(b)) is None


def test_a_circuit_too_deep_for_the_model_is_not_proposed() -> None:
    ranked = rank_circuits(lookup_rows(10, 0))
    assert propose(ranked, n_layers=1) is None
    assert propose(ranked, n_layers=2).name == "induction"  # type: ignore[union-attr]


def test_no_scored_target_is_an_error() -> None:
    with pytest.raises(ValueError, match="no scored target"):
        rank_circuits(batch([[1, 2]], [[IGNORE, IGNORE]]))


def reference(name: str, tokens: list[int], real: list[bool], t: int) -> int | None:
    """The token circuit ``name`` predicts at position ``t`` of one row, by an explicit loop."""
    if name == "induction":
        for j in range(t - 1, -1, -1):
            if real[j] and tokens[j] == tokens[t]:
                return tokens[j + 1] if real[j + 1] else None
        return None
    if name == "first_token":
        first = real.index(True)
        return tokens[first] if t > first else None
    src = t - int(name.removeprefix("offset_"))
    return tokens[src] if src >= 0 and real[src] else None


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_shares_equal_an_explicit_loop_on_random_padded_rows(seed: int) -> None:
    g = torch.Generator().manual_seed(seed)
    B, T = 7, 13
    tokens = torch.randint(4, 8, (B, T), generator=g)  # 4 symbols: many repeats
    lengths = torch.randint(3, T + 1, (B,), generator=g)
    mask = (torch.arange(T) < lengths[:, None]).long()
    targets = torch.randint(4, 8, (B, T), generator=g)
    scored = (torch.rand(B, T, generator=g) < 0.6) & mask.bool()
    targets = torch.where(scored, targets, IGNORE)
    got = shares(Batch(tokens, targets, mask, torch.zeros(B, dtype=torch.long)))
    goal = [int(v) for v in targets[scored]]
    p = {v: goal.count(v) / len(goal) for v in goal}
    for name in NAMES:
        hits, chance = 0, 0.0
        for b in range(B):
            row, real = tokens[b].tolist(), mask[b].bool().tolist()
            for t in range(T):
                if scored[b, t]:
                    pred = reference(name, row, real, t)
                    hits += pred == int(targets[b, t])
                    chance += p.get(pred, 0.0) if pred is not None else 0.0
        assert got[name].share == pytest.approx(hits / len(goal)), name
        assert got[name].chance == pytest.approx(chance / len(goal)), name


def test_rows_measured_in_several_passes_count_as_one_pass() -> None:
    # 300 rows of 256 positions take two passes of the induction rule; the counts add up.
    g = torch.Generator().manual_seed(0)
    tokens = torch.randint(4, 12, (300, 256), generator=g)
    targets = torch.randint(4, 12, (300, 256), generator=g)
    whole = shares(Batch(tokens, targets, None, torch.zeros(300, dtype=torch.long)))
    parts = [shares(Batch(tokens[s], targets[s], None, torch.zeros(150, dtype=torch.long)))
             for s in (slice(0, 150), slice(150, 300))]
    assert whole["induction"].share == pytest.approx(
        (parts[0]["induction"].share + parts[1]["induction"].share) / 2)


def test_built_in_tasks_key_value_retrieval_gets_its_declared_circuit() -> None:
    g = torch.Generator().manual_seed(0)
    kv = build_task("kv_retrieval")
    best = propose(rank_circuits(kv.sample(128, g)))
    assert best is not None and best.share == 1.0
    assert best.roles == kv.circuit
    periodic = build_task("induction", {"seq_len": 24, "period": [4, 8]})
    assert propose(rank_circuits(periodic.sample(64, g))).name == "induction"  # type: ignore
    for name in ("reverse", "modular_addition", "bracket_depth"):
        assert propose(rank_circuits(build_task(name).sample(128, g))) is None, name
