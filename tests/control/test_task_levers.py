"""Per-task levers against independent references: ablate()'s own zeroing and explicit CE."""

from __future__ import annotations

from typing import Any

import pytest
import torch
import torch.nn.functional as F
from host_reads import forbid_host_reads

from headwise.control.objectives import RoleBound
from headwise.control.task_levers import (
    AblatedMargin,
    OnProbeData,
    StochasticAblation,
    TaskLossWeight,
    row_uniforms,
)
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


def _ablated_rows(lever: StochasticAblation, batch: Batch, step: int) -> torch.Tensor:
    lever.prepare(batch, step)
    assert lever._keep is not None
    rows = lever._keep == 0
    lever.reset()
    return rows


def test_stochastic_ablation_draws_differ_from_step_to_step() -> None:
    """Every example is ablated at a share ``p`` of the steps, not at all of them or none: a
    task with few distinct inputs must not get a fixed set of always-ablated examples (the
    model would learn to answer those through the ablated heads alone). Over 400 steps at p =
    0.5 each row's share has standard deviation 0.025; the bounds are 6 of them away."""
    model = make()
    batch = Batch(_batch().tokens, _batch().targets, None, torch.zeros(12, dtype=torch.long))
    lever = StochasticAblation(model, "L1.H0", task_ids=[0], weight=0.5, name="a")
    draws = torch.stack([_ablated_rows(lever, batch, step) for step in range(400)])
    share = draws.float().mean(0)  # (12,)
    assert bool(((share > 0.35) & (share < 0.65)).all()), share
    # Reproducible: the same batch at the same step draws the same examples (resume exactness).
    assert torch.equal(_ablated_rows(lever, batch, 7), draws[7])


def test_stochastic_ablation_ablates_nothing_in_eval_mode() -> None:
    """As dropout: evaluation measures the model, not the model under its training noise."""
    model, batch = make(), _batch()
    lever = StochasticAblation(model, "L1.H0,L1.H2", task_ids=[0, 1, 2], weight=1.0, name="a")
    clean = model(batch.tokens, task_ids=batch.task_ids)
    model.eval()
    try:
        logits, (_, logs) = _forward(model, lever, batch)
    finally:
        model.train()
    assert torch.equal(logits, clean) and float(logs["a/ablated"]) == 0.0


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


@pytest.mark.slow
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


def test_ablated_margin_is_the_multiclass_hinge_of_the_model_with_the_heads_zeroed() -> None:
    model, batch = make(), _batch()
    lever = AblatedMargin(model, "L0.H1,L1.H3", task_ids=[0, 2], weight=2.0, delta=0.5)
    _, (term, logs) = _forward(model, lever, batch)
    with model.hooks(ablate(model, "L0.H1,L1.H3")):
        ref = model(batch.tokens, task_ids=batch.task_ids)
    hinges, right = [], []
    for b in range(12):  # explicit loops: the clause's positions, one by one
        if int(batch.task_ids[b]) not in (0, 2):
            continue
        for t in range(9):
            y = int(batch.targets[b, t])
            if y < 0:
                continue
            row = ref[b, t].detach()
            other = max(float(row[j]) for j in range(23) if j != y)
            hinges.append(max(0.0, 0.5 + float(row[y]) - other))
            right.append(float(row[y]) > other)
    assert float(term.detach()) == pytest.approx(2.0 * sum(hinges) / len(hinges), rel=1e-5)
    assert float(logs["ablated-margin/ablated_accuracy"]) == pytest.approx(
        sum(right) / len(right))
    term.backward()  # the gradient reaches the other heads, never the zeroed ones
    q = model.blocks[1].attn.o_proj.weight.grad  # (D, H*Dh): input columns per head
    assert q is not None and float(q[:, 3 * 6:].abs().sum()) == 0.0
    assert float(q[:, :3 * 6].abs().sum()) > 0.0
    lever.weight = 0.0  # no second forward, a zero term
    _, (off, _) = _forward(model, lever, batch)
    assert float(off) == 0.0


def test_row_uniforms_are_a_function_of_each_row_and_the_salt() -> None:
    g = torch.Generator().manual_seed(1)
    tokens = torch.randint(0, 50, (4000, 7), generator=g)
    u = row_uniforms(tokens, 17)
    assert u.shape == (4000,) and float(u.min()) >= 0.0 and float(u.max()) < 1.0
    assert torch.equal(row_uniforms(tokens.flip(0), 17), u.flip(0))  # per row
    assert not torch.equal(row_uniforms(tokens, 18), u)
    counts = torch.histc(u, bins=10, min=0.0, max=1.0)  # roughly uniform: 400 +- 5 sigma
    assert float((counts - 400).abs().max()) < 5 * 400 ** 0.5


def test_a_lever_step_reads_nothing_back_to_the_host(monkeypatch: pytest.MonkeyPatch) -> None:
    """prepare, forward, loss and backward of every lever at a positive weight, with every
    Tensor -> Python conversion raising (on a GPU each would synchronise with the host)."""
    model, batch = make(), _batch()
    probe = _batch()
    levers = [StochasticAblation(model, "L1.H0", [1], 0.5, name="s"),
              AblatedMargin(model, "L1.H1", [0], 1.0),
              TaskLossWeight(model, 1, 2.0),
              OnProbeData(model, RoleBound(model, "L0.H3", "self", max=0.2),
                          lambda n, seed: type(probe)(*(x.repeat(n // 12, *[1] * (x.dim() - 1))
                                                        for x in (probe.tokens, probe.targets)),
                                                      None, probe.task_ids.repeat(n // 12)))]
    levers[-1].weight = 1.0
    for lever in levers:  # the probe pool is drawn on the host once, before the first step
        if isinstance(lever, OnProbeData):
            lever._rows(batch, 0)

    forbid_host_reads(monkeypatch)
    for lever in levers:
        lever.prepare(batch, 5)  # a training step's draws are salted on the host
    hooks = [h for lever in levers for h in lever.hooks()]
    with model.hooks(*hooks):
        logits = model(batch.tokens, task_ids=batch.task_ids)
    total = logits.float().mean()
    for lever in levers:
        total = total + lever.loss(batch.tokens)[0]
    total.backward()
    monkeypatch.undo()
    assert all(p.grad is not None for p in model.parameters() if p.requires_grad)


def test_levers_in_one_step_do_not_depend_on_their_order() -> None:
    """The trainer's forward (``training.evaluate.forward``) with a task floor, an ablation
    lever and the ablated-margin lever, whose loss runs a forward of its own: the terms do not
    depend on the clause order, and the margin's term is the one it has alone (the other
    levers' hooks stay out of its forward)."""
    from headwise.training.evaluate import forward

    model, batch = make(), _batch()
    cpu = torch.device("cpu")

    def levers() -> dict[str, Any]:
        return {"floor": TaskLossWeight(model, 1, 2.0, name="floor"),
                "abl": StochasticAblation(model, "L0.H0", task_ids=[0, 1, 2], weight=1.0,
                                          name="abl"),
                "margin": AblatedMargin(model, "L1.H1", [0], 1.0, name="margin")}

    def terms(order: list[str]) -> dict[str, float]:
        made = levers()
        got = forward(model, model, batch, [made[k] for k in order], False, cpu)[1]
        return {k: float(t) for k, (t, _) in zip(order, got, strict=True)}

    first, last = terms(["margin", "floor", "abl"]), terms(["floor", "abl", "margin"])
    assert first == pytest.approx(last, rel=1e-6)
    alone = terms(["margin"])["margin"]
    assert first["margin"] == pytest.approx(alone, rel=1e-6) and alone > 0


def test_a_failed_step_leaves_no_lever_state_behind() -> None:
    """The one forward resets every lever, also when the forward raises mid-way: the next
    (evaluation) forward sees no ablation draw, batch or captured pattern of the failed step."""
    from headwise.control.objectives import PatternObjective
    from headwise.hooks import Hook
    from headwise.training.evaluate import forward

    model, batch = make(), _batch()
    levers = [StochasticAblation(model, "L1.H0", [0, 1, 2], 1.0, name="s"),
              AblatedMargin(model, "L1.H1", [0], 1.0), TaskLossWeight(model, 1, 2.0),
              PatternObjective(model, "L0.H1", "previous_token")]

    def boom(x: torch.Tensor, ctx: object) -> None:
        raise RuntimeError("out of memory")

    hooks = [h for lever in levers for h in lever.hooks()] + [Hook("blocks.1.hook_resid_pre", boom)]
    with pytest.raises(RuntimeError, match="out of memory"):
        forward(model, model, batch, levers, False, torch.device("cpu"), hooks)
    assert levers[0]._keep is None and levers[1]._batch is None
    assert levers[2]._logits is None and levers[2]._batch is None
    assert levers[3]._capture._captured == {}
    clean = model(batch.tokens, task_ids=batch.task_ids)  # no leftover ablation in the model
    logits, _ = forward(model, model, batch, [], False, torch.device("cpu"))
    assert torch.equal(clean, logits)
