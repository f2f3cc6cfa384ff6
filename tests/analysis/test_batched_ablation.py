"""Batched ablation (many sets in one forward, from the clean residual stream at the ablated
layer) equals ablating one set at a time with ``headwise.hooks.ablate`` and a full forward."""

from __future__ import annotations

import pytest
import torch

from headwise import ModelConfig, build_model
from headwise.analysis.batched_ablation import ablated_stats
from headwise.analysis.importance import example_stats
from headwise.heads import select_heads
from headwise.hooks.interventions import ablate
from headwise.model.build import build_mlm_head
from tests.analysis.plain_batch import B


def _model(causal: bool, dtype: torch.dtype) -> torch.nn.Module:
    cfg = ModelConfig(n_layers=3, n_heads=4, d_model=32, vocab_size=23, max_seq_len=16,
                      causal=causal, norm="pre" if causal else "post")
    model = build_model(cfg, seed=11)
    if not causal:
        model.mlm_head = build_mlm_head(cfg, seed=12)
    return model.to(dtype).eval()


def _batch(n: int = 6, T: int = 9) -> B:
    g = torch.Generator().manual_seed(4)
    tokens = torch.randint(0, 23, (n, T), generator=g)
    targets = torch.where(torch.rand(n, T, generator=g) < 0.4, tokens.roll(-1, 1), -100)
    mask = torch.ones(n, T, dtype=torch.long)
    mask[0, 6:] = 0
    targets[0, 6:] = -100
    return B(tokens, targets, mask)


UNITS = ["L0.H0", "L0.H3", "L1.H2", "L2.H1", "L0.H1,L2.H0", "L1.*", "L1.H0,L1.H3,L2.H2"]


@pytest.mark.parametrize("mode", ["zero", "mean", "resample"])
@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("max_elements", [1, 1 << 26])  # one set per chunk, and all at once
def test_batched_equals_one_set_at_a_time(mode: str, causal: bool, max_elements: int) -> None:
    model, batch = _model(causal, torch.float64), _batch()
    units = [select_heads(model, u) for u in UNITS]
    ref = torch.randint(0, 23, (5, 12), generator=torch.Generator().manual_seed(9))
    kw = {"attention_mask": batch.attention_mask}
    with torch.no_grad():
        clean, ablated = ablated_stats(model, batch, units, mode,
                                       None if mode == "zero" else ref, {}, seed=3,
                                       max_elements=max_elements)
        expect_clean = example_stats(model(batch.tokens, **kw), batch.targets)
        for unit, got in zip(units, ablated, strict=True):
            hooks = ablate(model, unit, mode=mode, reference=None if mode == "zero" else ref,
                           seed=3)
            with model.hooks(hooks):
                expect = example_stats(model(batch.tokens, **kw), batch.targets)
            for metric, (num, den) in expect.items():
                torch.testing.assert_close(got[metric][0], num, rtol=0, atol=1e-10)
                torch.testing.assert_close(got[metric][1], den, rtol=0, atol=0)
    for metric, (num, _) in expect_clean.items():
        torch.testing.assert_close(clean[metric][0], num, rtol=0, atol=1e-10)


def test_float32_agrees_within_rounding() -> None:
    model, batch = _model(True, torch.float32), _batch()
    units = [select_heads(model, u) for u in UNITS]
    with torch.no_grad():
        _, ablated = ablated_stats(model, batch, units)
        for unit, got in zip(units, ablated, strict=True):
            with model.hooks(ablate(model, unit)):
                expect = example_stats(model(batch.tokens, attention_mask=batch.attention_mask),
                                       batch.targets)
            torch.testing.assert_close(got["loss"][0], expect["loss"][0], rtol=1e-5, atol=1e-5)


def test_short_reference_is_refused() -> None:
    model, batch = _model(True, torch.float32), _batch()
    with pytest.raises(ValueError, match="reference"):
        ablated_stats(model, batch, [select_heads(model, "L0.H0")], "mean",
                      torch.zeros(3, 4, dtype=torch.long))
