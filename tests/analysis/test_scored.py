"""Logits at scored positions only equal the full forward's logits there, with and without a
masked-LM head; the metrics computed from them equal the full computation's."""

from __future__ import annotations

import pytest
import torch

from headwise import ModelConfig, build_model
from headwise.analysis.importance import example_stats
from headwise.analysis.scored import scored_logits, scored_stats
from headwise.model.build import build_mlm_head
from tests.analysis.plain_batch import B


def _model(causal: bool, mlm: bool) -> torch.nn.Module:
    cfg = ModelConfig(n_layers=2, n_heads=3, d_model=24, vocab_size=29, max_seq_len=16,
                      causal=causal, norm="pre" if causal else "post")
    model = build_model(cfg, seed=5)
    if mlm:
        model.mlm_head = build_mlm_head(cfg, seed=6)
        with torch.no_grad():
            model.mlm_head.bias.normal_()
    return model.eval()


def _batch(seed: int = 0, n: int = 7, T: int = 11) -> B:
    g = torch.Generator().manual_seed(seed)
    tokens = torch.randint(0, 29, (n, T), generator=g)
    targets = torch.where(torch.rand(n, T, generator=g) < 0.3, tokens, -100)
    targets[2] = -100  # an example with nothing scored
    mask = torch.ones(n, T, dtype=torch.long)
    mask[1, 8:] = 0
    targets[1, 8:] = -100
    return B(tokens, targets, mask)


@pytest.mark.parametrize(("causal", "mlm"), [(True, False), (False, False), (False, True)])
def test_scored_logits_equal_full_logits_at_scored_positions(causal: bool, mlm: bool) -> None:
    model, batch = _model(causal, mlm), _batch()
    with torch.no_grad():
        full = model(batch.tokens, attention_mask=batch.attention_mask)  # (B, T, V)
        part = scored_logits(model, batch)  # (N, V)
    valid = batch.targets != -100
    assert part.shape == (int(valid.sum()), 29)
    torch.testing.assert_close(part, full[valid], rtol=0, atol=1e-5)


@pytest.mark.parametrize(("causal", "mlm"), [(True, False), (False, True)])
def test_scored_stats_equal_the_full_computation(causal: bool, mlm: bool) -> None:
    model, batch = _model(causal, mlm), _batch(1)
    with torch.no_grad():
        full = example_stats(model(batch.tokens, attention_mask=batch.attention_mask),
                             batch.targets)
        part = scored_stats(model, batch)
    for metric, (num, den) in full.items():
        torch.testing.assert_close(part[metric][0], num, rtol=1e-6, atol=1e-6)
        torch.testing.assert_close(part[metric][1], den, rtol=0, atol=0)


def test_nothing_scored_gives_zero_counts() -> None:
    model, batch = _model(True, False), _batch(2)
    batch.targets[:] = -100
    with torch.no_grad():
        stats = scored_stats(model, batch)
    assert float(stats["loss"][1].sum()) == 0 and float(stats["exact"][1].sum()) == 0
