"""Preserve distances per row: one call per chunk gives each row's (sum, count) as that row
alone gives it, for every metric, on padded rows, a causal model and an encoder (pooled
cosine), and each against explicit maths."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
from torch import Tensor

from headwise import ModelConfig, Transformer, build_model
from headwise.contract.preserve import METRICS, _Rows

B, T, V = 5, 9, 23


def _model(causal: bool) -> tuple[Transformer, Transformer]:
    """The start (a copy) and the model moved from it by noise; every dimension distinct."""
    cfg = ModelConfig(n_layers=2, n_heads=3, d_model=18, d_head=6, d_ff=28, vocab_size=V,
                      max_seq_len=16, causal=causal, norm="pre" if causal else "post")
    model = build_model(cfg, seed=0)
    start = copy.deepcopy(model).eval()
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=g) * 0.05)
    return start, model.eval()


def _rows(causal: bool) -> _Rows:
    """Right padding on two rows (row 3: one real token, so no next-token target); next-token
    targets for the causal model, scattered targets (none on row 3) for the encoder."""
    g = torch.Generator().manual_seed(2)
    tokens = torch.randint(0, V, (B, T), generator=g)
    mask = torch.ones(B, T, dtype=torch.long)
    mask[1, 4:] = 0
    mask[3, 1:] = 0
    if causal:
        targets = torch.full((B, T), -100)
        targets[:, :-1] = tokens[:, 1:]
    else:
        targets = tokens.masked_fill(torch.rand(B, T, generator=g) > 0.4, -100)
        targets[0, 2] = tokens[0, 2]
    targets = targets.masked_fill(mask == 0, -100)
    targets[:, -1] = -100
    targets[3] = -100
    return _Rows(tokens, mask, torch.zeros(B, dtype=torch.long), targets)


def _explicit(metric: str, ref: Tensor, out: Tensor, rows: _Rows,
              pooled: bool) -> tuple[Tensor, Tensor]:
    """Each row's (sum, count), in float64, from the definitions."""
    assert rows.targets is not None and rows.attention_mask is not None
    scored = rows.targets != -100
    if metric == "kl":
        lp, lq = ref.double().log_softmax(-1), out.double().log_softmax(-1)
        kl = (lp.exp() * (lp - lq)).sum(-1)  # (B, T)
        return (kl * scored).sum(1), scored.sum(1).double()
    if metric == "loss_increase":
        ce = [F.cross_entropy(x.double().transpose(1, 2), rows.targets, reduction="none")
              for x in (out, ref)]  # (B, T), 0 where not scored
        return (ce[0] - ce[1]).sum(1), scored.sum(1).double()
    if pooled:
        m = rows.attention_mask.double()[..., None]
        a, b = ((x.double() * m).sum(1) / m.sum(1) for x in (ref, out))
        return F.cosine_similarity(a, b, dim=-1), torch.ones(B, dtype=torch.float64)
    cos = F.cosine_similarity(ref.double(), out.double(), dim=-1)  # (B, T)
    return (cos * scored).sum(1), scored.sum(1).double()


@pytest.mark.parametrize("causal", [True, False], ids=["causal", "encoder"])
@pytest.mark.parametrize("metric", ["hidden_cosine", "kl", "loss_increase"])
def test_a_chunks_row_sums_are_each_rows_own(metric: str, causal: bool) -> None:
    spec = METRICS[metric]
    assert spec.sums is not None
    start, model = _model(causal)
    rows = _rows(causal)
    pooled = spec.reads_hidden and not causal
    kw = {"attention_mask": rows.attention_mask}
    with torch.no_grad():
        ref, out = ((m.hidden(rows.tokens, **kw) if spec.reads_hidden else m(rows.tokens, **kw))
                    for m in (start, model))
    num, den = spec.sums(ref, out, rows, pooled)
    assert num.shape == den.shape == (B,)
    for i, row in rows.chunks(1):  # each row alone: the same, bit for bit
        alone = spec.sums(ref[i], out[i], row, pooled)
        assert alone[0].shape == alone[1].shape == (1,)
        torch.testing.assert_close(num[i].double(), alone[0].double(), rtol=1e-12, atol=0)
        torch.testing.assert_close(den[i].double(), alone[1].double(), rtol=0, atol=0)
    want_num, want_den = _explicit(metric, ref, out, rows, pooled)
    torch.testing.assert_close(den.double(), want_den, rtol=0, atol=0)
    # float32 sums of a few float32 terms (a loss increase: of two sums near 20)
    torch.testing.assert_close(num.double(), want_num, rtol=1e-4, atol=1e-5)
    if not pooled:  # row 3 has no scored position: nothing counted
        assert float(num[3]) == 0.0 and float(den[3]) == 0.0
