"""Head walkthrough: every step matches an explicit recomputation from the weights."""

from __future__ import annotations

import math

import pytest
import torch

from headwise import ModelConfig, build_model
from headwise.analysis.explain import explain_head


@pytest.mark.parametrize("positional, kv", [("learned", 4), ("rope", 2)])
def test_walkthrough_steps_and_checks(positional: str, kv: int) -> None:
    cfg = ModelConfig(n_layers=2, n_heads=4, n_kv_heads=kv, d_model=40, d_head=6, vocab_size=23,
                      max_seq_len=16, positional=positional)  # type: ignore[arg-type]
    model = build_model(cfg, seed=2).eval()
    tokens = torch.randint(0, 23, (9,))
    mask = torch.tensor([1] * 8 + [0])
    w = explain_head(model, tokens, "L0.H3", attention_mask=mask)
    assert w.ok, w.checks
    shapes = {s.name.split(" ")[0]: s.shape for s in w.steps}
    assert shapes["Q"] == (9, 6) and shapes["K"] == (9, 6) and shapes["V"] == (9, 6)
    assert w.step("pattern").shape == (9, 9) and w.step("result").shape == (9, 40)
    # independent check for layer 0 with learned positions: explicit maths from the weights
    if positional == "learned":
        attn = model.blocks[0].attn
        x = model.blocks[0].ln1(model.embed.weight[tokens] + model.pos_embed(9))
        q = (x @ attn.q_proj.weight[18:24].T + attn.q_proj.bias[18:24]).double()
        k = (x @ attn.k_proj.weight[18:24].T + attn.k_proj.bias[18:24]).double()
        v = (x @ attn.v_proj.weight[18:24].T + attn.v_proj.bias[18:24]).double()
        s = (q @ k.T) / math.sqrt(6)
        allowed = torch.ones(9, 9, dtype=torch.bool).tril() & mask.bool()[None]
        p = torch.softmax(s.masked_fill(~allowed, float("-inf")), -1)
        assert torch.allclose(w.step("raw scores").value, q @ k.T, atol=1e-5)
        assert torch.allclose(w.step("pattern").value, p, atol=1e-5)
        z = p @ v
        assert torch.allclose(w.step("z").value, z, atol=1e-5)
        res = z @ attn.o_proj.weight[:, 18:24].T.double()
        assert torch.allclose(w.step("result").value, res, atol=1e-5)
    text = w.to_text()
    assert "pattern (9, 9)" in text and "softmax" in text and "MISMATCH" not in text
    html = w.to_html()
    assert html.count("<img") == len(w.steps) and "data:image/png;base64," in html


def test_walkthrough_rejects_batches() -> None:
    model = build_model(ModelConfig(n_layers=1, n_heads=2, d_model=8, vocab_size=5,
                                    max_seq_len=8), seed=0)
    with pytest.raises(ValueError, match="tokens: got"):
        explain_head(model, torch.zeros(2, 4, dtype=torch.long), "L0.H0")


@pytest.mark.parametrize("kv", [4, 2])
def test_walkthrough_reads_structural_masks(kv: int) -> None:
    """The masked scores follow the model's own mask, head masks included: a head masked to the
    previous token has -inf everywhere but ``k = q - 1`` and attends exactly there (row 0, with
    no allowed key, is all zeros); a neighbouring unmasked head keeps the causal mask."""
    from headwise.control import apply_masks, previous_token

    cfg = ModelConfig(n_layers=1, n_heads=4, n_kv_heads=kv, d_model=40, d_head=6, vocab_size=23,
                      max_seq_len=16)
    model = build_model(cfg, seed=2).eval()
    apply_masks(model, {"L0.H3": previous_token()})
    tokens = torch.randint(0, 23, (7,), generator=torch.Generator().manual_seed(0))
    w = explain_head(model, tokens, "L0.H3")
    assert w.ok, w.checks
    expected = torch.zeros(7, 7, dtype=torch.float64)
    expected[torch.arange(1, 7), torch.arange(0, 6)] = 1.0
    assert torch.equal(w.step("pattern").value, expected)
    finite = torch.isfinite(w.step("masked scores").value)
    assert torch.equal(finite, expected.bool())
    other = explain_head(model, tokens, "L0.H2")
    assert other.ok, other.checks
    assert torch.equal(torch.isfinite(other.step("masked scores").value),
                       torch.ones(7, 7, dtype=torch.bool).tril())
