"""Ablation, gradient (Michel et al. 2019) and patching importance against explicit references."""

from __future__ import annotations

import copy
import math

import pytest
import torch
import torch.nn.functional as F

from headwise import Head, ModelConfig, build_model, scale
from headwise.analysis.importance import (
    ablation_importance,
    gradient_importance,
    task_metric_ci,
    task_metrics,
)
from headwise.analysis.importance_matrix import bootstrap_ci
from headwise.analysis.patching import activation_patching
from tests.analysis.plain_batch import B


def _model(n_layers: int = 2) -> torch.nn.Module:
    cfg = ModelConfig(n_layers=n_layers, n_heads=3, d_model=24, vocab_size=17, max_seq_len=16,
                      attn_only=True)
    return build_model(cfg, seed=3).eval()


def _batch(seed: int, n: int = 12, T: int = 10) -> B:
    g = torch.Generator().manual_seed(seed)
    tokens = torch.randint(0, 17, (n, T), generator=g)
    targets = tokens.roll(-1, 1).clone()
    targets[:, -1] = -100
    targets[:, :3] = -100
    return B(tokens, targets)


def _zero_o_columns(model: torch.nn.Module, head: Head) -> torch.nn.Module:
    """Reference for zero ablation: the head's output-projection columns set to zero."""
    m = copy.deepcopy(model)
    with torch.no_grad():
        m.blocks[head.layer].attn.o_proj.weight[:, head.head * 8:(head.head + 1) * 8] = 0
    return m


def test_task_metrics_explicit() -> None:
    model, batch = _model(), _batch(0)
    logits = model(batch.tokens)
    valid = batch.targets != -100
    loss = F.cross_entropy(logits[valid], batch.targets[valid]).detach()
    acc = (logits.argmax(-1)[valid] == batch.targets[valid]).float().mean()
    hits = (logits.argmax(-1) == batch.targets) | ~valid
    exact = hits.all(1)[valid.any(1)].float().mean()
    got = task_metrics(model, batch)
    assert got["loss"] == pytest.approx(float(loss), rel=1e-5)
    assert got["accuracy"] == pytest.approx(float(acc))
    assert got["exact"] == pytest.approx(float(exact))


def test_task_metric_ci_brackets_the_value_and_resamples_examples() -> None:
    """The task clause's CI: a percentile bootstrap over examples of the metric itself, checked
    against an explicit resampling with the same generator draws."""
    model, batch = _model(), _batch(3)
    value, lo, hi = task_metric_ci(model, batch, "accuracy", n_boot=300, seed=5)
    assert value == pytest.approx(task_metrics(model, batch)["accuracy"])
    logits = model(batch.tokens)
    valid = batch.targets != -100
    hit = ((logits.argmax(-1) == batch.targets) & valid).sum(1).double()
    count = valid.sum(1).double()
    idx = torch.randint(0, hit.shape[0], (300, hit.shape[0]),
                        generator=torch.Generator().manual_seed(5))
    boots = hit[idx].sum(1) / count[idx].sum(1)
    q = torch.quantile(boots, torch.tensor([0.025, 0.975], dtype=boots.dtype))
    assert (lo, hi) == pytest.approx((float(q[0]), float(q[1])), abs=1e-9)
    assert lo < value < hi
    with pytest.raises(ValueError, match="metric: got 'acc'"):
        task_metric_ci(model, batch, "acc")


def test_zero_ablation_matches_zeroed_output_projection() -> None:
    model = _model()
    tasks = {"a": _batch(1), "b": _batch(2, T=12)}
    imp = ablation_importance(model, tasks, heads="L0.H1,L1.H2", n_boot=200)
    for head in (Head(0, 1), Head(1, 2)):
        ref_model = _zero_o_columns(model, head)
        for task, batch in tasks.items():
            clean, ablated = task_metrics(model, batch), task_metrics(ref_model, batch)
            assert imp.get(head, task, "loss") == pytest.approx(ablated["loss"] - clean["loss"],
                                                                abs=1e-5)
            assert imp.get(head, task, "accuracy") == pytest.approx(
                clean["accuracy"] - ablated["accuracy"], abs=1e-9)
            lo, hi = imp.ci(head, task, "loss")
            assert lo <= imp.get(head, task, "loss") + 1e-9 <= hi + 2e-9
    recs = imp.to_records()
    assert len(recs) == 2 * 2 * 3 and {"unit", "task", "metric", "ci_low"} <= set(recs[0])


def test_group_ablation_and_mean_mode() -> None:
    model, batch = _model(), _batch(4)
    imp = ablation_importance(model, batch, groups=["L1.*"], mode="mean", n_boot=0)
    # reference: replace every layer-1 head's z with its batch mean, by explicit maths
    _, cache = model.run_with_cache(batch.tokens, names=["blocks.1.attn.hook_z"])
    mean_z = cache["blocks.1.attn.hook_z"].mean(0, keepdim=True)
    with model.hooks(("blocks.1.attn.hook_z", lambda z, ctx: mean_z.expand_as(z).clone())):
        ref = task_metrics(model, batch)
    assert imp.get("L1.H0,L1.H1,L1.H2", "task", "loss") == pytest.approx(
        ref["loss"] - task_metrics(model, batch)["loss"], abs=1e-5)


def test_bootstrap_identical_runs_has_zero_interval() -> None:
    num = torch.rand(20, dtype=torch.float64)
    point, lo, hi = bootstrap_ci(num, num, torch.ones(20, dtype=torch.float64), 1.0, 100, 0.95,
                                 torch.Generator().manual_seed(0))
    assert point == lo == hi == 0.0


def test_bootstrap_interval_matches_the_normal_approximation() -> None:
    """Paired differences d_i ~ N(0.3, 1) with unit counts: the percentile interval of the
    mean is close to mean +- 1.96 sd / sqrt(B) (central limit theorem), and the point
    estimate is the explicit ratio of sums."""
    g = torch.Generator().manual_seed(1)
    B = 400
    clean = torch.rand(B, generator=g, dtype=torch.float64)
    diffs = 0.3 + torch.randn(B, generator=g, dtype=torch.float64)
    point, lo, hi = bootstrap_ci(clean, clean + diffs, torch.ones(B, dtype=torch.float64), 1.0,
                                 4000, 0.95, torch.Generator().manual_seed(2))
    mean, half = float(diffs.mean()), 1.96 * float(diffs.std()) / math.sqrt(B)
    assert point == pytest.approx(mean, abs=1e-12)
    assert lo == pytest.approx(mean - half, abs=0.15 * half)
    assert hi == pytest.approx(mean + half, abs=0.15 * half)
    # a drop (sign -1) of a ratio metric with uneven counts: sum(num) / sum(count)
    count = torch.arange(1, B + 1, dtype=torch.float64) % 5 + 1
    point, lo, hi = bootstrap_ci(clean * count, (clean + diffs) * count, count, -1.0, 500,
                                 0.9, torch.Generator().manual_seed(3))
    ref = -(float(((clean + diffs) * count).sum()) - float((clean * count).sum())) / float(
        count.sum())
    assert point == pytest.approx(ref, abs=1e-12) and lo < point < hi


def _explicit_loss(model: torch.nn.Module, one: B) -> float:
    """One example's mean cross-entropy over its scored positions, in the model's dtype."""
    logits = model(one.tokens)[0]  # (T, V)
    valid = one.targets[0] != -100
    return float(F.cross_entropy(logits[valid], one.targets[0][valid]))


def test_gradient_importance_matches_finite_differences() -> None:
    """Central differences of each example's loss in the head's scale, in float64.

    In float32 the loss (about 3 nats) is rounded to ~2e-7, while a step of 1e-3 moves it by
    only ~2e-6 per example: the float32 difference quotient is itself a few percent off (the
    gradient is not: see the next test). In float64 the rounding error of the quotient is
    ~1e-16 * 3 / 1e-3 and the central-difference truncation error eps^2 |L'''| / 6, both far
    below 1e-6 of a gradient of ~1e-3.
    """
    model, batch = _model().double(), _batch(5, n=6)
    imp = gradient_importance(model, {"t": batch}, n_boot=50)
    eps = 1e-3
    for head in (Head(0, 0), Head(1, 2)):
        per_example = []
        for b in range(6):
            one = B(batch.tokens[b:b + 1], batch.targets[b:b + 1])
            with torch.no_grad(), model.hooks(scale(model, str(head), 1 + eps)):
                up = _explicit_loss(model, one)
            with torch.no_grad(), model.hooks(scale(model, str(head), 1 - eps)):
                down = _explicit_loss(model, one)
            per_example.append(abs(up - down) / (2 * eps))
        ref = sum(per_example) / len(per_example)
        assert imp.get(head, "t", "gradient") == pytest.approx(ref, rel=1e-6)


def test_gradient_importance_float32_matches_float64() -> None:
    """The float32 gradient is exact to float32 precision (backpropagation has no step size)."""
    model, batch = _model(), _batch(5, n=6)
    wide = gradient_importance(copy.deepcopy(model).double(), batch, n_boot=0)
    narrow = gradient_importance(model, batch, n_boot=0)
    for head in (Head(0, 0), Head(0, 1), Head(1, 2)):
        assert narrow.get(head, "task", "gradient") == pytest.approx(
            wide.get(head, "task", "gradient"), rel=1e-4)


def test_gradient_importance_abs_per_example_not_per_batch() -> None:
    """|mean of gradients| <= mean of |gradients|: per-batch abs would understate importance."""
    model, batch = _model(), _batch(6, n=16)
    imp = gradient_importance(model, batch, heads="L1.H0", n_boot=0)
    gate = torch.ones(1, requires_grad=True)
    with model.hooks(scale(model, "L1.H0", 1.0)), model.hooks(
            ("blocks.1.attn.hook_z", lambda z, ctx: z * gate.to(z.dtype), (0,))):
        logits = model(batch.tokens)
    valid = batch.targets != -100
    ce = F.cross_entropy(logits.transpose(1, 2), batch.targets, reduction="none")
    per_ex = (ce * valid).sum(1) / valid.sum(1)
    (g,) = torch.autograd.grad(per_ex.mean(), gate)
    assert abs(float(g)) <= imp.get("L1.H0", "task", "gradient") + 1e-9


def test_activation_patching_matches_explicit_one_layer_maths() -> None:
    model = _model(n_layers=1)
    g = torch.Generator().manual_seed(7)
    clean = torch.randint(0, 17, (4, 9), generator=g)
    corrupted = clean.clone()
    corrupted[:, 3] = (corrupted[:, 3] + 5) % 17

    def metric(logits: torch.Tensor) -> torch.Tensor:
        return logits[:, -1, 2].mean() - logits[:, -1, 5].mean()

    res = activation_patching(model, clean, corrupted, metric)
    _, c_clean = model.run_with_cache(clean, names=["blocks.0.attn.hook_z"])
    _, c_corr = model.run_with_cache(corrupted, names=["blocks.0.attn.hook_z"])
    attn = model.blocks[0].attn
    resid = model.embed.weight[corrupted] + model.pos_embed(9)
    for h in range(3):
        z = c_corr["blocks.0.attn.hook_z"].clone()
        z[:, :, h] = c_clean["blocks.0.attn.hook_z"][:, :, h]
        x = resid + attn.o_proj(z.reshape(4, 9, 24))
        ref = metric(model.unembed(model.ln_final(x))).detach()
        assert res.patched[Head(0, h)] == pytest.approx(float(ref), abs=1e-5)
        assert abs(res.clean - res.corrupted) > 1e-4  # the corruption moved the metric
        assert res.recovered(Head(0, h)) == pytest.approx(
            (float(ref) - res.corrupted) / (res.clean - res.corrupted), abs=1e-4)
    assert len(res.to_records()) == 3
    same = activation_patching(model, clean, clean, metric)  # no gap: recovery is undefined
    assert math.isnan(same.recovered(Head(0, 0)))


def test_accepts_headwise_data_batch() -> None:
    from headwise.data.batch import Batch

    b = _batch(8)
    batch = Batch(b.tokens, b.targets, None, torch.zeros(12, dtype=torch.long))
    model = _model()
    imp = ablation_importance(model, {"x": batch}, heads="L0.H0", n_boot=10)
    ref = (task_metrics(_zero_o_columns(model, Head(0, 0)), b)["loss"]
           - task_metrics(model, b)["loss"])
    assert abs(ref) > 1e-4 and imp.get("L0.H0", "x", "loss") == pytest.approx(ref, abs=1e-5)


def test_ratio_stderr_and_ci_stderr_against_closed_forms() -> None:
    from statistics import NormalDist

    from headwise.analysis.importance_matrix import ci_stderr, ratio_stderr

    x = torch.tensor([0.2, 0.5, 0.9, 0.4, 0.7], dtype=torch.float64)
    # Equal denominators: the standard error of a mean, s / sqrt(n).
    assert ratio_stderr(x * 3, torch.full_like(x, 3.0)) == pytest.approx(
        float(x.std() / math.sqrt(5)))
    # Unequal ones: the linearised ratio estimator written out.
    den = torch.tensor([1.0, 2.0, 4.0, 1.0, 2.0], dtype=torch.float64)
    num = x * den
    r = float(num.sum() / den.sum())
    by_hand = math.sqrt(5 / 4 * sum((float(n) - r * float(d)) ** 2
                                    for n, d in zip(num, den, strict=True))) / float(den.sum())
    assert ratio_stderr(num, den) == pytest.approx(by_hand)
    assert math.isnan(ratio_stderr(num[:1], den[:1]))
    z = NormalDist().inv_cdf(0.975)
    assert ci_stderr(0.5 - z * 0.03, 0.5 + z * 0.03) == pytest.approx(0.03)
    assert math.isnan(ci_stderr(math.nan, 1.0))
