"""Levers that must work under training: a pattern objective, and learned task gates."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from headwise import ModelConfig, Transformer, build_model
from headwise.control import (
    LearnedGates,
    PatternObjective,
    apply_masks,
    first_token,
    gate_table,
    previous_token,
    self_only,
)


def previous_token_score(model: Transformer, tokens: torch.Tensor) -> float:
    """Mean attention of L0.H0 from position t to t - 1, over t >= 1 and the batch."""
    _, cache = model.run_with_cache(tokens, ["blocks.0.attn.hook_pattern"], heads="L0.H0")
    p = cache.head("blocks.0.attn.hook_pattern", 0)  # (B, T, T)
    t = torch.arange(1, p.shape[-1])
    return float(p[:, t, t - 1].mean())


def train_lm(with_objective: bool, steps: int = 200) -> float:
    """Random-token LM on a 2-layer attention-only model; returns L0.H0's score afterwards."""
    V = 16
    model = build_model(ModelConfig(n_layers=2, n_heads=4, d_model=32, vocab_size=V,
                                    max_seq_len=16, attn_only=True), seed=0)
    objective = PatternObjective(model, "L0.H0", "previous_token", kind="kl")
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    gen = torch.Generator().manual_seed(1)
    for _ in range(steps):
        tokens = torch.randint(0, V, (16, 12), generator=gen)
        with model.hooks(*(objective.hooks() if with_objective else [])):
            logits = model(tokens)
        loss = F.cross_entropy(logits[:, :-1].reshape(-1, V), tokens[:, 1:].reshape(-1))
        if with_objective:
            loss = loss + objective.loss(tokens)[0]
        opt.zero_grad()
        loss.backward()
        opt.step()
    return previous_token_score(model, torch.randint(0, V, (64, 12), generator=gen))


def test_previous_token_objective_makes_l0h0_a_previous_token_head() -> None:
    assert train_lm(with_objective=True) >= 0.95
    assert train_lm(with_objective=False) < 0.95


def test_learned_gates_pick_distinct_heads_for_two_tasks() -> None:
    """Task 0 predicts the previous token, task 1 the first token; the heads are masked so
    that only L0.H0 can see the previous token and only L0.H1 the first one."""
    V, T = 12, 8
    model = build_model(ModelConfig(n_layers=1, n_heads=4, d_model=32, vocab_size=V,
                                    max_seq_len=T, attn_only=True), seed=0)
    apply_masks(model, {"L0.H0": previous_token(), "L0.H1": first_token(),
                        "L0.H2-3": self_only()})
    gates = LearnedGates(model, n_tasks=2, init=2.0)
    penalty = gates.l0_penalty(weight=0.02)
    others = [p for n, p in model.named_parameters() if "log_alpha" not in n]
    opt = torch.optim.AdamW([{"params": others}, {"params": gates.parameters(), "lr": 0.1}],
                            lr=1e-2, weight_decay=0.0)
    gen = torch.Generator().manual_seed(1)
    for _ in range(150):
        tokens = torch.randint(0, V, (32, T), generator=gen)
        task = torch.randint(0, 2, (32,), generator=gen)
        target = torch.where(task[:, None] == 0, tokens.roll(1, 1), tokens[:, :1].expand(-1, T))
        logits = model(tokens, task_ids=task)
        loss = F.cross_entropy(logits[:, 1:].reshape(-1, V), target[:, 1:].reshape(-1))
        loss = loss + penalty.loss(tokens)[0]
        opt.zero_grad()
        loss.backward()
        opt.step()
    model.eval()
    active = gate_table(model, ["previous", "first"]).active()
    assert str(active["previous"]) == "L0.H0"
    assert str(active["first"]) == "L0.H1"
