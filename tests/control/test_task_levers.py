"""Per-task levers against independent references: ablate()'s own zeroing and explicit CE."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from headwise.control.objectives import RoleBound
from headwise.control.task_levers import StochasticAblation, TaskLossWeight
from headwise.data import Batch
from headwise.hooks import ablate
from headwise.patterns import role_target, row_scores
from tests.control.conftest import make


def _batch() -> Batch:
    g = torch.Generator().manual_seed(0)
    tokens = torch.randint(0, 23, (12, 9), generator=g)
    targets = tokens.roll(-1, 1)
    targets[:, -1] = -100
    return Batch(tokens, targets, None, torch.arange(12) % 3)


def _forward(model, lever, batch):  # type: ignore[no-untyped-def]
    lever.prepare(batch)
    with model.hooks(*lever.hooks()):
        logits = model(batch.tokens, task_ids=batch.task_ids)
    return logits, lever.loss(batch.tokens)


def test_stochastic_ablation_zeroes_exactly_the_drawn_examples_of_its_tasks() -> None:
    model, batch = make(), _batch()
    lever = StochasticAblation(model, "L1.H0,L1.H2", task_ids=[1, 2], weight=0.6, name="a")
    logits, (term, logs) = _forward(model, lever, batch)
    clean = model(batch.tokens, task_ids=batch.task_ids)
    with model.hooks(ablate(model, "L1.H0,L1.H2")):
        ablated = model(batch.tokens, task_ids=batch.task_ids)
    hit = [b for b in range(12) if torch.allclose(logits[b], ablated[b], atol=1e-6)
           and not torch.allclose(logits[b], clean[b], atol=1e-6)]
    untouched = [b for b in range(12) if torch.allclose(logits[b], clean[b], atol=1e-6)]
    assert sorted(hit + untouched) == list(range(12))  # every example is one or the other
    assert hit and all(int(batch.task_ids[b]) in (1, 2) for b in hit)  # task 0 never ablated
    assert float(term) == 0.0 and logs["a/ablated"] == pytest.approx(len(hit) / 12)
    # The draw is a function of the batch: the same batch, the same examples.
    again, _ = _forward(model, lever, batch)
    assert torch.equal(again, logits)
    lever.weight = 0.0
    off, _ = _forward(model, lever, batch)
    assert torch.equal(off, clean)


def test_task_loss_weight_is_weight_times_the_tasks_own_cross_entropy() -> None:
    model, batch = make(), _batch()
    lever = TaskLossWeight(model, task_id=2, weight=3.0)
    logits, (term, _) = _forward(model, lever, batch)
    rows = batch.task_ids == 2
    ref = F.cross_entropy(logits[rows].reshape(-1, 23), batch.targets[rows].reshape(-1),
                          ignore_index=-100)
    assert float(term.detach()) == pytest.approx(3.0 * float(ref.detach()), rel=1e-5)
    term.backward()
    assert model.blocks[0].attn.q_proj.weight.grad is not None


def test_role_bound_penalises_the_role_mass_above_the_bound() -> None:
    model, batch = make(), _batch()
    lever = RoleBound(model, "L0.H1", "self", max=0.1)
    with model.hooks(*lever.hooks()):
        model(batch.tokens)
    term, logs = lever.loss(batch.tokens)
    _, cache = model.run_with_cache(batch.tokens, ["blocks.0.attn.hook_pattern"], heads="L0.H1")
    P = cache.head("blocks.0.attn.hook_pattern", 1)  # (B, T, T)
    target = role_target("self", batch.tokens)
    s = row_scores(P[:, None], target)[:, 0]
    rows = target.rows
    assert float(term.detach()) == pytest.approx(float(torch.relu(s - 0.1)[rows].mean()), rel=1e-5)
    assert logs["bound:self/L0.H1"] == pytest.approx(float(s[rows].mean()), rel=1e-5)


def test_raising_every_tasks_loss_weight_together_barely_moves_adamw() -> None:
    """Under Adam(W) a common scale of the loss cancels (m / sqrt(v)), so TaskLossWeight on
    every task of a mixture at once changes little, while the same weight on one task trades
    the other away (docs/levers.md, "Task floors")."""
    from headwise.pipeline import compile_spec
    from headwise.runspec import load_spec
    from headwise.training import train

    spec = load_spec("""
model: {n_layers: 1, n_heads: 2, d_model: 32, vocab_size: 14, max_seq_len: 11}
data: {tasks: {copy: {length: 4}, sort: {length: 4}}}
train: {steps: 150, batch_size: 32, lr: 3.0e-3, eval_every: 0, seed: 0, grad_clip: 0}
""")

    def params_after(weights: dict[int, float]) -> torch.Tensor:
        c = compile_spec(spec)
        objs = [TaskLossWeight(c.model, t, w, name=f"w{t}") for t, w in weights.items()]
        train(c.model, c.data, spec.train, objectives=objs, progress=False)
        return torch.cat([p.detach().flatten() for p in c.model.parameters()])

    plain = params_after({})
    def moved(weights: dict[int, float]) -> float:
        return float((params_after(weights) - plain).norm() / plain.norm())
    both, copy_only, sort_only = moved({0: 8.0, 1: 8.0}), moved({0: 8.0}), moved({1: 8.0})
    assert both < 0.5 * min(copy_only, sort_only)
