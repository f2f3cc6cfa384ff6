"""Distillation to the starting model: each lever's term against an explicit computation on the
same batch, and training with it moves the model back towards the start."""

from __future__ import annotations

import copy
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from host_reads import forbid_host_reads

from headwise.contract import VerifyData, parse_contract, verify
from headwise.control import Distill, PatternDistill, capture_base
from headwise.control.base_reference import BaseReference
from headwise.control.distill import (
    final_hidden_point,
    kl_sums,
    kl_terms,
    per_sequence,
    scored_rows,
)
from headwise.data import Batch
from headwise.training.evaluate import forward

from .conftest import make

CPU = torch.device("cpu")


def _batch(seed: int = 5, B: int = 6, T: int = 9) -> Batch:
    """Two tasks, right padding on some rows, some targets not scored."""
    g = torch.Generator().manual_seed(seed)
    tokens = torch.randint(0, 23, (B, T), generator=g)
    targets = torch.randint(0, 23, (B, T), generator=g)
    targets[:, :3] = -100
    mask = torch.ones(B, T, dtype=torch.long)
    mask[1, 5:] = 0
    mask[4, 7:] = 0
    targets[mask == 0] = -100
    return Batch(tokens, targets, mask, torch.arange(B) % 2)


def _perturb(model: torch.nn.Module, scale: float, seed: int = 0) -> None:
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=g) * scale)


def _moved(model: torch.nn.Module, scale: float) -> tuple[torch.nn.Module, Any]:
    """A frozen copy of ``model`` as it starts (the reference), its base captured, and
    ``model`` then perturbed by ``scale``: what a lever must measure the distance of."""
    start = copy.deepcopy(model).eval()
    base = capture_base(model)
    _perturb(model, scale)
    return start, base


def _step(model: torch.nn.Module, lever: object, batch: Batch) -> torch.Tensor:
    model.train()
    _, [(term, _)] = forward(model, model, batch, [lever], False, CPU)  # type: ignore[list-item]
    return term


@pytest.mark.parametrize("norm", ["pre", "post"])
def test_the_final_hidden_point_gives_the_models_hidden_states(norm: str) -> None:
    model = make(norm=norm)
    batch = _batch()
    name, post = final_hidden_point(model)
    _, cache = model.run_with_cache(batch.tokens, names=[name],
                                    attention_mask=batch.attention_mask)
    with torch.no_grad():
        assert torch.equal(post(cache[name]), model.hidden(batch.tokens, batch.attention_mask))


def test_the_kl_lever_is_the_mean_kl_to_the_start_over_the_tasks_scored_positions() -> None:
    model, batch = make(dropout=0.0), _batch()
    start, base = _moved(model, 0.2)
    lever = Distill(model, base, "kl", task_id=1, weight=3.0, name="d")
    term = _step(model, lever, batch)
    with torch.no_grad():
        p = start(batch.tokens, attention_mask=batch.attention_mask).double().softmax(-1)
        q = model(batch.tokens, attention_mask=batch.attention_mask).double().softmax(-1)
    kls = [float((p[b, t] * (p[b, t].log() - q[b, t].log())).sum())
           for b in range(6) for t in range(9)
           if int(batch.task_ids[b]) == 1 and int(batch.targets[b, t]) != -100]
    assert float(term.detach()) == pytest.approx(3.0 * sum(kls) / len(kls), rel=1e-5)
    term.backward()
    assert all(p.grad is not None for p in model.parameters())
    lever.weight = 0.0  # no base forward at weight 0
    base.model = None  # type: ignore[method-assign]
    assert float(_step(model, lever, batch)) == 0.0


def test_without_a_task_the_kl_lever_scores_every_rows_targets() -> None:
    model, batch = make(dropout=0.0), _batch()
    start, base = _moved(model, 0.2)
    term = _step(model, Distill(model, base, "kl", weight=1.0), batch)
    with torch.no_grad():
        p = start(batch.tokens, attention_mask=batch.attention_mask).double().softmax(-1)
        q = model(batch.tokens, attention_mask=batch.attention_mask).double().softmax(-1)
    kl = (p * (p.log() - q.log())).sum(-1)  # (B, T)
    assert float(term.detach()) == pytest.approx(float(kl[batch.targets != -100].mean()),
                                                 rel=1e-5)


def test_the_kl_sums_are_the_same_on_the_gathered_and_the_weighted_rows() -> None:
    g = torch.Generator().manual_seed(0)
    p, q = torch.randn(2, 3, 5, 11, generator=g)
    valid = torch.rand(3, 5, generator=g) > 0.6
    sums = []
    for gather in (True, False):
        (a, w), (b, _) = scored_rows(p, valid, gather), scored_rows(q, valid, gather)
        assert a.shape[0] == (int(valid.sum()) if gather else 15)
        sums.append(kl_sums(a, b, w))
    torch.testing.assert_close(sums[0], sums[1])
    expected = F.kl_div(q.log_softmax(-1), p.log_softmax(-1), reduction="none",
                        log_target=True).sum(-1)[valid]
    torch.testing.assert_close(sums[0][0], expected.sum())


def test_per_sequence_sums_are_the_same_on_the_gathered_and_the_weighted_rows() -> None:
    g = torch.Generator().manual_seed(0)
    p, q = torch.randn(2, 3, 5, 11, generator=g)
    valid = torch.rand(3, 5, generator=g) > 0.6
    valid[1] = False  # a sequence with nothing scored
    sums = []
    for gather in (True, False):
        (a, w), (b, _) = scored_rows(p, valid, gather), scored_rows(q, valid, gather)
        sums.append(per_sequence(kl_terms(a, b) * w, valid))
    assert sums[0].shape == (3,) and torch.equal(sums[0], sums[1])  # bit for bit
    kl = F.kl_div(q.double().log_softmax(-1), p.double().log_softmax(-1), reduction="none",
                  log_target=True).sum(-1)  # (3, 5)
    torch.testing.assert_close(sums[0].double(), (kl * valid).sum(1), rtol=1e-5, atol=1e-6)
    assert float(sums[0][1]) == 0.0


def test_the_cosine_lever_pools_an_encoders_states_over_the_attention_mask() -> None:
    model, batch = make(causal=False, norm="post"), _batch()
    start, base = _moved(model, 0.2)
    term = _step(model, Distill(model, base, "hidden_cosine", weight=1.0), batch)
    model.eval()
    cos = []
    with torch.no_grad():
        h0 = start.hidden(batch.tokens, batch.attention_mask).double()
        h1 = model.hidden(batch.tokens, batch.attention_mask).double()
    for b in range(6):  # sentence-transformers' mean pooling, row by row
        n = int(batch.attention_mask[b].sum())
        a, c = h0[b, :n].mean(0), h1[b, :n].mean(0)
        cos.append(float(a @ c / (a.norm() * c.norm())))
    assert float(term.detach()) == pytest.approx(1.0 - sum(cos) / 6, rel=1e-5)


@pytest.mark.parametrize("task_id", [None, 1])
def test_the_pattern_lever_is_the_mean_row_kl_of_the_heads_to_the_start(
        task_id: int | None) -> None:
    """Over every real query row, or over one task's rows where ``task_id`` is set (its
    role-drift estimate too: that of the same heads on those rows alone)."""
    from headwise.control.distill import role_drift

    model, batch = make(dropout=0.0), _batch()
    start, base = _moved(model, 0.3)
    lever = PatternDistill(model, base, "L0.H1,L1.H0,L1.H3", weight=1.0)
    lever.task_id, lever.measured = task_id, True
    model.train()
    lever.prepare(batch, 0)
    with model.hooks(*lever.hooks()):
        model(batch.tokens, attention_mask=batch.attention_mask, task_ids=batch.task_ids)
    term, _ = lever.loss(batch.tokens, batch.attention_mask)
    estimate = lever.batch_values()
    names = ["blocks.0.attn.hook_pattern", "blocks.1.attn.hook_pattern"]
    mask = batch.attention_mask
    assert mask is not None
    _, c0 = start.run_with_cache(batch.tokens, names=names, attention_mask=mask)
    _, c1 = model.run_with_cache(batch.tokens, names=names, attention_mask=mask)
    mine = [b for b in range(6) if task_id is None or int(batch.task_ids[b]) == task_id]
    heads = ((0, 1), (1, 0), (1, 3))
    pick = torch.tensor(mine)
    drift = role_drift(
        torch.cat([c0[names[l]][:, [h]] for l, h in heads], 1)[pick],
        torch.cat([c1[names[l]][:, [h]] for l, h in heads], 1)[pick],
        batch.tokens[pick], mask[pick], causal=True)
    assert estimate is not None and float(estimate) == pytest.approx(float(drift), abs=1e-6)
    rows = []
    for layer, head in heads:
        name = names[layer]
        for b in mine:
            for i in range(int(mask[b].sum())):
                p, q = c0[name][b, head, i].double(), c1[name][b, head, i].double()
                keep = p > 0
                rows.append(float((p[keep] * (p[keep].log() - q[keep].log())).sum()))
    assert float(term.detach()) == pytest.approx(sum(rows) / len(rows), rel=1e-4)


def test_the_levers_work_with_hooks_made_once_per_run() -> None:
    """The trainer makes every objective's hooks once and reuses them at every step."""
    model, batch = make(dropout=0.0), _batch()
    base = capture_base(model)
    _perturb(model, 0.2)
    levers = [Distill(model, base, "kl", weight=1.0, name="k"),
              Distill(model, base, "hidden_cosine", weight=1.0, name="c"),
              PatternDistill(model, base, "L0.H1,L1.*", weight=1.0, name="p")]
    hooks = [h for lever in levers for h in lever.hooks()]
    first = [float(t.detach()) for t, _ in forward(model, model, batch, levers, False, CPU,
                                                    hooks)[1]]
    again = [float(t.detach()) for t, _ in forward(model, model, batch, levers, False, CPU,
                                                    hooks)[1]]
    assert again == pytest.approx(first) and min(first) > 0.0


def test_the_levers_on_one_batch_share_one_start_forward() -> None:
    """Each lever's term as when it is the only lever on its own start; one start forward."""
    model, batch = make(dropout=0.0), _batch()
    pristine = copy.deepcopy(model)
    base = capture_base(model)
    _perturb(model, 0.2)

    def lever(i: int, m: torch.nn.Module, b: BaseReference) -> object:
        return [lambda: Distill(m, b, "hidden_cosine", weight=1.0, name="c"),
                lambda: PatternDistill(m, b, "L0.H1,L1.H2", weight=1.0, name="p"),
                lambda: PatternDistill(m, b, "L1.H0,L1.H2", weight=1.0, name="q"),
                lambda: Distill(m, b, "kl", weight=1.0, name="k")][i]()
    runs = []
    with base.model() as start:
        handle = start.embed.register_forward_hook(lambda *args: runs.append(1))
    model.train()
    shared = [float(t.detach()) for t, _ in forward(
        model, model, batch, [lever(i, model, base) for i in range(4)], False, CPU)[1]]
    handle.remove()
    alone = []
    for i in range(4):  # each on a fresh copy of the start, perturbed alike
        twin = copy.deepcopy(pristine)
        twin_base = capture_base(twin)
        _perturb(twin, 0.2)
        alone.append(float(_step(twin, lever(i, twin, twin_base), batch).detach()))
    assert len(runs) == 1
    assert shared == pytest.approx(alone, rel=1e-6) and min(shared) > 0.0


def _measure(model: torch.nn.Module, base: object, clause: dict, held_out: Batch) -> float:
    contract = parse_contract([clause], 2, 4, ["a", "b"])
    data = VerifyData(tasks={"a": held_out}, probes={"default": held_out}, base=base,
                      named=frozenset())
    result = verify(model, contract, data).results[0]
    assert result.measured is not None
    return result.measured


@pytest.mark.parametrize("clause,lever", [
    ({"preserve": "base", "metric": "kl", "at_most": 0.0}, "kl"),
    ({"preserve": "base", "metric": "role_drift", "at_most": 0.0}, "patterns"),
])
def test_training_with_the_lever_brings_the_measured_distance_down(clause: dict,
                                                                   lever: str) -> None:
    """A perturbed model trained on the lever alone for 25 steps (fresh training batches, a
    held-out batch measured): the clause's distance to the start falls below a third (seen:
    KL 0.93 -> 0.010, role drift 0.39 -> 0.052)."""
    model = make(dropout=0.0)
    base = capture_base(model)
    _perturb(model, 0.3)
    held_out = _batch(seed=99, B=16)
    before = _measure(model, base, clause, held_out)
    obj = (Distill(model, base, "kl", weight=1.0) if lever == "kl"
           else PatternDistill(model, base, "L0.*,L1.*", weight=1.0))
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    for step in range(25):
        opt.zero_grad()
        _step(model, obj, _batch(seed=step, B=16)).backward()
        opt.step()
    after = _measure(model, base, clause, held_out)
    assert before > 0.05 and after < before / 3, (before, after)


def test_a_distillation_step_reads_nothing_back_to_the_host(
        monkeypatch: pytest.MonkeyPatch) -> None:
    model, batch = make(), _batch()
    base = capture_base(model)
    _perturb(model, 0.1)
    levers = [Distill(model, base, "kl", task_id=0, weight=1.0, name="k"),
              Distill(model, base, "hidden_cosine", weight=1.0, name="c"),
              PatternDistill(model, base, "L1.H2", weight=1.0, name="p")]

    forbid_host_reads(monkeypatch)
    for lever in levers:
        lever.prepare(batch)
    with model.hooks(*[h for lever in levers for h in lever.hooks()]):
        model(batch.tokens, attention_mask=batch.attention_mask, task_ids=batch.task_ids)
    total = sum(lever.loss(batch.tokens, batch.attention_mask)[0] for lever in levers)
    total.backward()  # type: ignore[union-attr]
    monkeypatch.undo()
    assert all(p.grad is not None for p in model.parameters())
