"""Post-norm residual points at TransformerLens's positions, against the block's maths.

A post-norm block computes ``y = ln1(x + attn(x))`` then ``ln2(y + mlp(y))``; TransformerLens's
BERT block names the sums before each norm ``hook_resid_mid`` / ``hook_resid_post``. The norms
are recomputed here with ``torch.nn.functional.layer_norm`` on the block's own weights.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from headwise.config import preset
from headwise.model import build_model


def _ln(x: torch.Tensor, norm: torch.nn.Module) -> torch.Tensor:
    return F.layer_norm(x, (x.shape[-1],), norm.weight, norm.bias, norm.eps)


@pytest.fixture()
def encoder():
    model = build_model(preset("tiny-encoder"), seed=0).eval()
    with torch.no_grad():  # non-trivial norms, so a missing or doubled norm shows
        for name, p in model.named_parameters():
            if p.dim() == 1:
                p.normal_(0.5 if "ln" in name else 0.0, 0.5)
    return model


def test_sums_before_the_norm_and_normalised_points(encoder) -> None:
    tokens = torch.randint(0, 17, (2, 6), generator=torch.Generator().manual_seed(0))
    logits, cache = encoder.run_with_cache(tokens, lambda n: n.startswith("blocks.")
                                           and "attn." not in n)
    for l, block in enumerate(encoder.blocks):
        p = f"blocks.{l}."
        mid = cache[p + "hook_resid_pre"] + cache[p + "hook_attn_out"]
        torch.testing.assert_close(cache[p + "hook_resid_mid"], mid, atol=1e-6, rtol=0)
        torch.testing.assert_close(cache[p + "hook_normalized_resid_mid"], _ln(mid, block.ln1),
                                   atol=1e-5, rtol=0)
        post = cache[p + "hook_normalized_resid_mid"] + cache[p + "hook_mlp_out"]
        torch.testing.assert_close(cache[p + "hook_resid_post"], post, atol=1e-6, rtol=0)
        torch.testing.assert_close(cache[p + "hook_normalized_resid_post"],
                                   _ln(post, block.ln2), atol=1e-5, rtol=0)
    out0, out1 = (cache[f"blocks.{l}.hook_normalized_resid_post"] for l in (0, 1))
    assert torch.equal(cache["blocks.1.hook_resid_pre"], out0)
    torch.testing.assert_close(logits, encoder.unembed(out1), atol=1e-5, rtol=0)


def test_attention_only_post_norm_block_has_one_sum() -> None:
    cfg = preset("tiny-encoder").replace(attn_only=True)
    model = build_model(cfg, seed=0).eval()
    names = set(model.hook_points())
    assert not {"blocks.0.hook_resid_mid", "blocks.0.hook_normalized_resid_mid"} & names
    tokens = torch.randint(0, 17, (2, 6))
    _, cache = model.run_with_cache(tokens, lambda n: n.startswith("blocks.0.hook"))
    post = cache["blocks.0.hook_resid_pre"] + cache["blocks.0.hook_attn_out"]
    torch.testing.assert_close(cache["blocks.0.hook_resid_post"], post, atol=1e-6, rtol=0)
    torch.testing.assert_close(cache["blocks.0.hook_normalized_resid_post"],
                               _ln(post, model.blocks[0].ln1), atol=1e-5, rtol=0)


def test_pre_norm_blocks_have_no_normalised_residual_points() -> None:
    names = set(build_model(preset("tiny"), seed=0).hook_points())
    assert "blocks.0.hook_resid_post" in names
    assert not {n for n in names if "normalized_resid" in n}
