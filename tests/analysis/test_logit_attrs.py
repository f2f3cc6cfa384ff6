"""``tokens_to_residual_directions`` against TransformerLens's folded unembedding, written out.

TransformerLens's default loading (``fold_ln``, ``center_writing_weights``, ``center_unembed``)
makes its ``W_U`` (D, V): ``gamma[:, None] * W_U``, then (LayerNorm only) minus its mean over
D for each token, then minus its mean over the vocabulary for each of the D rows; its
``tokens_to_residual_directions(t)`` is ``W_U[:, t]``.
"""

from __future__ import annotations

import pytest
import torch

from headwise.analysis.logit_attrs import tokens_to_residual_directions
from tests.analysis.test_decompose import LN, RMS, _setup


@pytest.mark.parametrize("cfg", [LN, RMS], ids=["layernorm", "rmsnorm"])
def test_directions_plain_and_as_transformerlens_folds_them(cfg) -> None:
    model, tokens, _, cache = _setup(cfg)
    W_U = model.unembed.weight.T.detach()  # (D, V), as TransformerLens stores it
    folded = model.ln_final.weight.detach()[:, None] * W_U
    if cfg is LN:
        folded = folded - folded.mean(0, keepdim=True)  # fold_ln's centring over d_model
    folded = folded - folded.mean(1, keepdim=True)  # center_unembed over d_vocab
    ids = torch.tensor([[3, 0], [7, 11]])
    plain = tokens_to_residual_directions(model, ids)
    torch.testing.assert_close(plain, (model.ln_final.weight[:, None] * W_U).T[ids])
    centred = tokens_to_residual_directions(model, ids, center=True)
    torch.testing.assert_close(centred, folded.T[ids], atol=1e-6, rtol=0)


def test_centring_leaves_logit_differences_of_a_layernorm_model_unchanged() -> None:
    """What the centring removes never reaches a logit difference: LayerNorm's output has
    mean 0 over D, and the vocabulary mean is the same for every token."""
    model, tokens, _, cache = _setup(LN)
    x = cache["ln_final.hook_normalized"]  # (B, T, D), centred and scaled, before the gain
    a, b = tokens_to_residual_directions(model, [4, 9]), tokens_to_residual_directions(
        model, [4, 9], center=True)
    diff_plain = x @ (a[0] - a[1])
    diff_centred = x @ (b[0] - b[1])
    torch.testing.assert_close(diff_centred, diff_plain, atol=1e-5, rtol=0)
    assert not torch.allclose(a, b)  # the directions themselves do differ
