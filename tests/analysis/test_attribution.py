"""Attribution patching: the estimate is the loss's directional derivative towards the ablated
value (checked by finite differences), and agrees with exact ablation on small models within
the stated tolerance; the screen keeps the largest estimates and the heads asked for."""

from __future__ import annotations

import pytest
import torch

from headwise import Head, ModelConfig, build_model, scale
from headwise.analysis.attribution import attribution_importance, screen_heads
from headwise.analysis.importance import ablation_importance, task_metrics
from tests.analysis.plain_batch import B


def _setup(causal: bool) -> tuple[torch.nn.Module, B]:
    cfg = ModelConfig(n_layers=3, n_heads=4, d_model=32, vocab_size=23, max_seq_len=16,
                      causal=causal, norm="pre" if causal else "post")
    model = build_model(cfg, seed=11).double().eval()
    g = torch.Generator().manual_seed(4)
    tokens = torch.randint(0, 23, (16, 12), generator=g)
    targets = torch.where(torch.rand(16, 12, generator=g) < 0.5, tokens.roll(-1, 1), -100)
    mask = torch.ones(16, 12, dtype=torch.long)
    mask[3, 9:] = 0
    targets[3, 9:] = -100
    return model, B(tokens, targets, mask)


@pytest.mark.parametrize("causal", [True, False])
def test_estimate_is_the_derivative_towards_zero(causal: bool) -> None:
    model, batch = _setup(causal)
    est = attribution_importance(model, batch)
    eps = 1e-6
    clean = task_metrics(model, batch)["loss"]
    for head in (Head(0, 1), Head(1, 3), Head(2, 0)):
        with model.hooks(scale(model, head, 1 - eps)):  # a step of eps towards zero
            moved = task_metrics(model, batch)["loss"]
        assert est.get(head, "task", "loss") == pytest.approx((moved - clean) / eps,
                                                              rel=1e-4, abs=1e-9)


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("mode", ["zero", "mean"])
def test_estimates_agree_with_exact_ablation(causal: bool, mode: str) -> None:
    """Tolerance: Pearson correlation >= 0.98 with the exact loss increases over the 12 heads,
    and every estimate within 15% of the largest exact effect of its exact value."""
    model, batch = _setup(causal)
    est = attribution_importance(model, batch, mode=mode).matrix("loss")[:, 0]  # type: ignore[arg-type]
    exact = ablation_importance(model, batch, mode=mode,  # type: ignore[arg-type]
                                n_boot=0).matrix("loss")[:, 0]
    assert float(torch.corrcoef(torch.stack([est, exact]))[0, 1]) >= 0.98
    assert float((est - exact).abs().max()) <= 0.15 * float(exact.abs().max())


def test_screen_keeps_the_largest_estimates_and_the_heads_asked_for() -> None:
    model, batch = _setup(True)
    est = attribution_importance(model, {"a": batch, "b": batch})
    top = int(est.matrix("loss")[:, 0].abs().argmax())
    chosen = screen_heads(est, keep=1, always=[Head(2, 2)])
    assert chosen == sorted({*est.units[top], Head(2, 2)})
    assert est.info["estimate"] is True
