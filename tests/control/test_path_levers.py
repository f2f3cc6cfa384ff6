"""Path levers against the explicit recomputation of path patching: a training forward with an
edge ablated on the drawn rows reads exactly the stream path patching defines there, and the
clean stream elsewhere; the margin's hinge is the hinge of the edge-ablated logits."""

from __future__ import annotations

import pytest
import torch

import headwise as hw
from headwise.control.path_levers import MEAN_POOL, PathAblatedMargin, StochasticPathAblation
from headwise.control.task_levers import margin_hinge, row_uniforms, salt_of, step_salt
from headwise.data import Batch
from headwise.hooks.graph import all_edges, model_shape, parse_edge
from headwise.training.evaluate import forward
from tests.analysis import path_reference as ref

B, T, V = 6, 7, 13
TOL = 1e-10  # float64: the two computations differ only by rounding


def _model() -> torch.nn.Module:
    cfg = hw.ModelConfig(n_layers=3, n_heads=4, n_kv_heads=2, d_model=20, d_head=6, d_ff=28,
                         vocab_size=V, max_seq_len=9, activation="gelu")
    model = hw.build_model(cfg).double()
    with torch.no_grad():  # weights large enough that every path matters
        for name, p in model.named_parameters():
            p.copy_((1.0 if "ln" in name else 0.0) + 0.4 * torch.randn_like(p))
    return model.train()  # dropout is 0: train mode changes only what the levers do


def _batch() -> Batch:
    targets = torch.randint(0, V, (B, T))
    targets[:, :2] = -100
    task_ids = torch.tensor([0, 1, 0, 0, 1, 0])  # task 1's rows are never ablated
    return Batch(torch.randint(0, V, (B, T)), targets, None, task_ids)


def _run(model: torch.nn.Module, batch: Batch, lever: object, step: int = 3) -> torch.Tensor:
    logits, _ = forward(model, model, batch, [lever], False, torch.device("cpu"), step=step)
    return logits


def test_a_drawn_row_reads_the_path_patched_stream_and_the_others_the_clean_one() -> None:
    model, batch = _model(), _batch()
    edge = parse_edge("L0.H1 -> L2.H2 via k", model_shape(model))  # kv head 1 of layer 2
    lever = StochasticPathAblation(model, [edge], [0], weight=0.5, name="p", mode="mean")
    got = _run(model, batch, lever)
    drawn = (row_uniforms(batch.tokens, step_salt("p", 3)) < 0.5) & (batch.task_ids == 0)
    assert 0 < int(drawn.sum()) < B  # the draw ablates some rows and spares others

    c = ref.forward(model, batch.tokens)
    head = c.results[0][1]  # (B, T, D) L0.H1's output
    # the clean mean: over task 0's rows the draw left clean, per position
    mean = head[(batch.task_ids == 0) & ~drawn].mean(0, keepdim=True)
    stream = c.x[2] - (head - mean) * drawn[:, None, None].double()
    want = ref.forward(model, batch.tokens, {("k", 2, 1): stream}).logits
    assert torch.allclose(got, want, atol=TOL, rtol=0)
    assert torch.equal(got[~drawn], model(batch.tokens)[~drawn])  # bitwise clean elsewhere


def test_with_a_pool_the_mean_is_the_pools_clean_mean_drawn_once_from_the_name() -> None:
    model, batch = _model(), _batch()
    pool = Batch(torch.randint(0, V, (9, T)), batch.targets[:1].expand(9, -1), None,
                 torch.zeros(9, dtype=torch.long))
    seeds = []

    def sample(n: int, seed: int) -> Batch:
        seeds.append((n, seed))
        return pool
    edge = parse_edge("L0.H1 -> L2.H2 via k", model_shape(model))
    lever = StochasticPathAblation(model, [edge], [0], weight=0.5, name="p", mode="mean",
                                   pool=sample)
    got, again = _run(model, batch, lever), _run(model, batch, lever)
    assert seeds == [(MEAN_POOL, salt_of("p"))] and torch.equal(got, again)  # drawn once
    drawn = (row_uniforms(batch.tokens, step_salt("p", 3)) < 0.5) & (batch.task_ids == 0)
    c = ref.forward(model, batch.tokens)
    head = c.results[0][1]
    mean = ref.forward(model, pool.tokens).results[0][1].mean(0, keepdim=True)  # the pool's
    stream = c.x[2] - (head - mean) * drawn[:, None, None].double()
    want = ref.forward(model, batch.tokens, {("k", 2, 1): stream}).logits
    assert torch.allclose(got, want, atol=TOL, rtol=0)


def test_zero_ablation_of_a_heads_only_reader_stops_its_gradient() -> None:
    """In a one-layer attention-only model a head's output reaches only the logits: with that
    edge zeroed on every row, nothing the head computes reaches the loss."""
    cfg = hw.ModelConfig(n_layers=1, n_heads=2, d_model=16, vocab_size=V, max_seq_len=9,
                         attn_only=True)
    model, batch = hw.build_model(cfg).double().train(), _batch()
    edge = parse_edge("L0.H1 -> logits", model_shape(model))
    lever = StochasticPathAblation(model, [edge], [0, 1], weight=1.0, mode="zero")
    logits = _run(model, batch, lever)
    torch.nn.functional.cross_entropy(logits.transpose(1, 2), batch.targets).backward()
    q = model.blocks[0].attn.q_proj.weight.grad.view(2, -1, 16)  # (H, Dh, D)
    # the two routes to the logits (o_proj, and the head's output subtracted) cancel up to
    # rounding: float64's, many orders below the other head's gradient
    assert float(q[1].abs().max()) < 1e-12 * float(q[0].abs().max())


def test_eval_mode_and_weight_zero_ablate_nothing() -> None:
    model, batch = _model(), _batch()
    edges = all_edges(model)[:5]
    clean = model(batch.tokens)
    for weight, train in ((0.0, True), (1.0, False)):
        model.train(train)
        got = _run(model, batch, StochasticPathAblation(model, edges, [0], weight=weight))
        assert torch.equal(got, clean)


@pytest.mark.parametrize("mode", ["zero", "mean"])
def test_the_margin_is_the_hinge_of_the_edge_ablated_logits(mode: str) -> None:
    model, batch = _model(), _batch()
    edge = parse_edge("L1.H3 -> logits", model_shape(model))
    lever = PathAblatedMargin(model, [edge], [0], weight=2.0, mode=mode)
    lever.prepare(batch, 0)
    value, logs = lever.loss(batch.tokens)
    c = ref.forward(model, batch.tokens)
    head, rows = c.results[1][3], batch.task_ids == 0
    source = head[rows].mean(0, keepdim=True) if mode == "mean" else torch.zeros_like(head)
    stream = c.final - (head - source) * rows[:, None, None].double()
    patched = ref.forward(model, batch.tokens, {("logits",): stream}).logits
    hinge, right = margin_hinge(patched, batch.targets, rows, 1.0)
    assert float(value) == pytest.approx(2.0 * float(hinge), abs=1e-9)
    assert float(logs["path-margin/ablated_accuracy"]) == pytest.approx(float(right))


@pytest.mark.parametrize("make", [
    lambda m, e: StochasticPathAblation(m, e, [], weight=0.5),
    lambda m, e: StochasticPathAblation(m, [], [0], weight=0.5),
    lambda m, e: StochasticPathAblation(m, e, [0], weight=1.5),
    lambda m, e: PathAblatedMargin(m, e, [0], mode="resample"),
])
def test_bad_arguments_are_named(make: object) -> None:
    model = _model()
    with pytest.raises(ValueError, match="StochasticPathAblation|PathAblatedMargin"):
        make(model, all_edges(model)[:1])  # type: ignore[operator]
