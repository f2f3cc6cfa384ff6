"""One definition per role: objectives and scores read the same target (headwise.patterns)."""

from __future__ import annotations

import pytest
import torch

import headwise as hw
from headwise.analysis import induction_probe, role_scores, scores_from_patterns
from headwise.control import EntropyBound, PatternObjective
from headwise.control.masks import apply_masks, previous_token
from headwise.control.objectives import pattern_target, row_loss
from headwise.data import build_task
from headwise.patterns import ROLE_NAMES, TARGET_ROLES, role_target

VOCAB, T = 24, 20


def induction_batch() -> torch.Tensor:
    """The library's own induction task: [BOS, periodic content], periods 3-8 mixed per row."""
    task = build_task("induction", {"vocab_size": VOCAB, "seq_len": T, "period": [3, 8]})
    return task.sample(32, torch.Generator().manual_seed(0)).tokens


def _model(causal: bool, layers: int) -> torch.nn.Module:
    cfg = hw.ModelConfig(n_layers=layers, n_heads=2, d_model=32, vocab_size=VOCAB,
                         max_seq_len=T, causal=causal)
    model = hw.build_model(cfg, seed=0)
    with torch.no_grad():  # sharp, position-driven start: far from every target, uniform too
        for block in model.blocks:
            block.attn.q_proj.weight.mul_(30.0)
            block.attn.k_proj.weight.mul_(30.0)
    if layers == 2:  # induction needs the previous token's identity at each key
        apply_masks(model, {"L0.H1": previous_token()})
    return model


@pytest.mark.parametrize("role", ROLE_NAMES)
def test_driving_a_roles_objective_to_zero_drives_its_score_to_one(role: str) -> None:
    """For every role: the objective (pattern KL, or the entropy bound) trained alone to a loss
    below 1e-3 leaves the head's role score >= 0.95 on the same tokens, from a start below 0.9."""
    causal = role != "next_token"
    layers = 2 if role == "induction" else 1
    tokens = induction_batch()
    model = _model(causal, layers)
    head = f"L{layers - 1}.H0"
    before = role_scores(model, tokens, heads=head, roles=[role]).get(head, role)
    obj = (EntropyBound(model, head, min=0.99) if role == "entropy"
           else PatternObjective(model, head, role, kind="kl"))
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    loss = torch.tensor(float("inf"))
    for _ in range(600):
        with model.hooks(*obj.hooks()):
            model(tokens)
        loss, _ = obj.loss(tokens)
        if float(loss.detach()) < 1e-3:
            break
        opt.zero_grad()
        loss.backward()
        opt.step()
    after = role_scores(model, tokens, heads=head, roles=[role]).get(head, role)
    assert before < 0.9, f"{role}: the start already scores {before:.3f}"
    assert float(loss.detach()) < 1e-3, f"{role}: objective stuck at {float(loss):.4f}"
    assert after >= 0.95, f"{role}: objective ~0 but score {after:.3f}"


@pytest.mark.parametrize("role", TARGET_ROLES)
@pytest.mark.parametrize("causal", [True, False])
def test_the_target_pattern_itself_scores_one_and_has_zero_loss(role: str, causal: bool) -> None:
    tokens = induction_batch()
    mask = torch.ones_like(tokens)
    mask[:5, -3:] = 0  # some right padding
    target = role_target(role, tokens, mask, causal)
    if not target.rows.any():
        assert role == "next_token" and causal  # undefined in causal models
        return
    perfect = target.weights[:, None]  # (B, 1, T, T)
    score = scores_from_patterns(perfect, tokens, mask, roles=[role], causal=causal)[role]
    assert float(score) == pytest.approx(1.0, abs=1e-6)
    Q, rows = pattern_target(role, tokens, mask, causal)
    assert torch.equal(rows, target.rows)
    for kind in ("kl", "mse"):
        assert row_loss(perfect[:, 0], Q, kind)[rows].abs().max() < 1e-6


def test_induction_is_the_olsson_stripe_on_clean_repeats_and_on_task_data() -> None:
    gen = torch.Generator().manual_seed(1)
    r = induction_probe(VOCAB, 4, 7, gen)  # [r, r], P = 7, distinct halves
    support = role_target("induction", r).support
    for q in range(2 * 7):
        expected = [q - 7 + 1] if q >= 7 else []
        assert support[0, q].nonzero().flatten().tolist() == expected
    # BOS + several repeats, a period per row: still k = q - P + 1 on every repeated position.
    task = build_task("induction", {"vocab_size": VOCAB, "seq_len": T, "period": [3, 8]})
    batch = task.sample(16, torch.Generator().manual_seed(2))
    target = role_target("induction", batch.tokens)
    for b in range(16):
        content = batch.tokens[b, 1:]
        period = next(p for p in range(3, 9) if torch.equal(content[p:], content[:-p]))
        for q in range(1, T):
            keys = target.support[b, q].nonzero().flatten().tolist()
            assert keys == ([q - period + 1] if q - 1 >= period else []), (b, q, period)


def test_entropy_has_one_unit_in_the_bound_and_the_score() -> None:
    model = _model(True, 1)
    tokens = induction_batch()
    bound = EntropyBound(model, "L0.H1", max=0.5)
    with model.hooks(*bound.hooks()):
        model(tokens)
    _, logs = bound.loss(tokens)
    score = role_scores(model, tokens, heads="L0.H1", roles=["entropy"]).get("L0.H1", "entropy")
    assert logs["entropy/L0.H1"] == pytest.approx(score, abs=1e-5)


def test_target_similarity_sums_rejects_a_target_of_another_shape() -> None:
    from headwise.patterns import target_similarity_sums

    tokens = torch.zeros(2, 5, dtype=torch.long)
    patterns = torch.full((2, 1, 5, 5), 0.2)
    with pytest.raises(ValueError, match=r"^target: got shape \(1, 4, 4\), expected \(T, T\) or "
                                         r"\(B, T, T\) with T=5, B=2$"):
        target_similarity_sums(patterns, torch.eye(4), tokens, None, causal=False)
    # a uniform head against a uniform target over all keys: identical rows, similarity 1
    num, den = target_similarity_sums(patterns, torch.ones(5, 5), tokens, None, causal=False)
    assert torch.allclose(num / den, torch.ones(1, dtype=num.dtype))
