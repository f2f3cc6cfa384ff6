"""Residual decomposition and logit attribution against their definitions, written out.

TransformerLens is not installed here; its definitions are stated explicitly instead:
- ``stack_head_results``: head h of layer l contributes ``z[..., h, :] @ W_O^h`` (the o_proj
  columns of head h, sliced by hand here), and a layer's heads plus ``b_O`` are its
  ``hook_attn_out`` (the model's own value);
- ``decompose_resid`` sums to the stream the model computed (``hook_resid_pre/mid/post``);
- ``accumulated_resid`` lists the cached streams; with ``apply_ln`` at the end it is
  ``torch.nn.functional.layer_norm`` with the final norm's weights, whose product with W_U is
  the model's logits;
- ``apply_ln_to_stack`` of a full decomposition sums to PyTorch's ``layer_norm`` /
  ``rms_norm`` (no affine) of the stream;
- ``logit_attrs`` of a full decomposition sums, with the final norm's bias term, to the
  model's logits (the identity TransformerLens's ``fold_ln`` attribution satisfies).
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from headwise.analysis.decompose import accumulated_resid, decompose_resid, stack_head_results
from headwise.analysis.logit_attrs import apply_ln_to_stack, logit_attrs
from headwise.config import ModelConfig, preset
from headwise.errors import ConfigError
from headwise.model import build_model

# LayerNorm, learned positions, biases (made non-zero below); every dimension distinct.
LN = ModelConfig(n_layers=3, n_heads=3, d_model=14, d_head=4, d_ff=22, vocab_size=19,
                 max_seq_len=12)
# RMSNorm, RoPE (no positional embedding), 6 query heads on 2 kv heads, no biases.
RMS = ModelConfig(n_layers=2, n_heads=6, n_kv_heads=2, d_model=20, d_head=8, d_ff=28,
                  vocab_size=23, max_seq_len=12, positional="rope", norm_type="rmsnorm",
                  activation="swiglu", bias="none")
B, T = 2, 9


def _setup(cfg: ModelConfig):
    model = build_model(cfg, seed=0).eval()
    with torch.no_grad():  # norms and biases away from 1/0 so every term matters
        g = torch.Generator().manual_seed(5)
        for name, p in model.named_parameters():
            if p.dim() == 1:
                p.copy_(torch.randn(p.shape, generator=g) * 0.5 + (1.0 if "ln" in name else 0))
    tokens = torch.randint(0, cfg.vocab_size, (B, T), generator=torch.Generator().manual_seed(1))
    logits, cache = model.run_with_cache(tokens, lambda n: "hook_result" not in n)
    return model, tokens, logits, cache


@pytest.fixture(params=[LN, RMS], ids=["layernorm", "rmsnorm-gqa"])
def setup(request):
    return _setup(request.param)


def test_stack_head_results_are_z_times_each_heads_o_columns(setup) -> None:
    model, tokens, _, cache = setup
    cfg = model.config
    H, Dh = cfg.n_heads, cfg.d_head
    stack, labels = stack_head_results(model, cache, return_labels=True)
    assert stack.shape == (cfg.n_layers * H, B, T, cfg.d_model)
    assert labels[:H + 1] == [f"L0.H{h}" for h in range(H)] + ["L1.H0"]
    for l in range(cfg.n_layers):
        o = model.blocks[l].attn.o_proj
        z = cache[f"blocks.{l}.attn.hook_z"]
        for h in range(H):
            ref = z[:, :, h] @ o.weight[:, h * Dh:(h + 1) * Dh].T
            torch.testing.assert_close(stack[l * H + h], ref, atol=1e-6, rtol=0)
        b_O = o.bias if o.bias is not None else 0
        torch.testing.assert_close(stack[l * H:(l + 1) * H].sum(0) + b_O,
                                   cache[f"blocks.{l}.hook_attn_out"], atol=1e-5, rtol=0)
    # From the model's own hook_result when that is cached: the same numbers.
    _, with_result = model.run_with_cache(tokens, lambda n: n.endswith("hook_result"))
    torch.testing.assert_close(stack_head_results(model, with_result), stack, atol=1e-5, rtol=0)
    # Remainder: the rest of the final stream; positions sliced like TransformerLens's.
    full = stack_head_results(model, cache, incl_remainder=True)
    torch.testing.assert_close(full.sum(0), cache[f"blocks.{cfg.n_layers - 1}.hook_resid_post"],
                               atol=1e-5, rtol=0)
    assert torch.equal(stack_head_results(model, cache, layer=1, pos_slice=-1),
                       stack[:H, :, -1])


def test_decompose_resid_sums_to_the_stream(setup) -> None:
    model, _, _, cache = setup
    L = model.config.n_layers
    embeds = ["embed", "pos_embed"] if model.config.positional == "learned" else ["embed"]
    for layer in range(L + 1):
        parts, labels = decompose_resid(model, cache, layer=layer, return_labels=True)
        assert labels == embeds + [f"{l}_{k}_out" for l in range(layer) for k in ("attn", "mlp")]
        ref = (cache[f"blocks.{layer}.hook_resid_pre"] if layer < L
               else cache[f"blocks.{L - 1}.hook_resid_post"])
        torch.testing.assert_close(parts.sum(0), ref, atol=1e-5, rtol=0)
    mid = decompose_resid(model, cache, layer=1, mlp_input=True)
    torch.testing.assert_close(mid.sum(0), cache["blocks.1.hook_resid_mid"], atol=1e-5, rtol=0)
    attn, labels = decompose_resid(model, cache, mode="attn", incl_embeds=False,
                                   return_labels=True)
    assert labels == [f"{l}_attn_out" for l in range(L)]
    torch.testing.assert_close(attn.sum(0), sum(cache[f"blocks.{l}.hook_attn_out"]
                                                for l in range(L)), atol=1e-5, rtol=0)


def test_apply_ln_to_stack_matches_torch_norms(setup) -> None:
    model, _, _, cache = setup
    L, eps = model.config.n_layers, model.ln_final.eps
    norm = F.layer_norm if model.config.norm_type == "layernorm" else F.rms_norm
    final = cache[f"blocks.{L - 1}.hook_resid_post"]
    scaled = decompose_resid(model, cache, apply_ln=True)
    torch.testing.assert_close(scaled.sum(0), norm(final, (final.shape[-1],), eps=eps),
                               atol=1e-5, rtol=0)
    pre1 = cache["blocks.1.hook_resid_pre"]
    scaled1 = decompose_resid(model, cache, layer=1, apply_ln=True, pos_slice=slice(2, 6))
    torch.testing.assert_close(scaled1.sum(0), norm(pre1, (pre1.shape[-1],), eps=eps)[:, 2:6],
                               atol=1e-5, rtol=0)
    mid0 = cache["blocks.0.hook_resid_mid"]  # ln2's input, scaled by ln2's statistics
    parts = decompose_resid(model, cache, layer=0, mlp_input=True)
    scaled_mid = apply_ln_to_stack(model, cache, parts, layer=0, mlp_input=True)
    torch.testing.assert_close(scaled_mid.sum(0), norm(mid0, (mid0.shape[-1],), eps=eps),
                               atol=1e-5, rtol=0)


def test_accumulated_resid_is_the_stream_by_layer_and_the_logit_lens(setup) -> None:
    model, _, logits, cache = setup
    L = model.config.n_layers
    acc, labels = accumulated_resid(model, cache, incl_mid=True, return_labels=True)
    assert labels == [x for l in range(L) for x in (f"{l}_pre", f"{l}_mid")] + ["final_post"]
    assert torch.equal(acc[2], cache["blocks.1.hook_resid_pre"])
    assert torch.equal(acc[3], cache["blocks.1.hook_resid_mid"])
    lens = accumulated_resid(model, cache, apply_ln=True)  # ln_final on each state
    ln = model.ln_final
    ref_norm = (F.layer_norm(acc[0], (acc.shape[-1],), ln.weight, ln.bias, ln.eps)
                if model.config.norm_type == "layernorm"
                else F.rms_norm(acc[0], (acc.shape[-1],), ln.weight, ln.eps))
    torch.testing.assert_close(lens[0], ref_norm, atol=1e-5, rtol=0)
    torch.testing.assert_close(lens[-1] @ model.W_U, logits, atol=1e-4, rtol=0)


def test_logit_attrs_sum_to_the_logits(setup) -> None:
    model, tokens, logits, cache = setup
    answer = tokens.roll(-1, dims=1)  # (B, T): the next token at every position
    beta = getattr(model.ln_final, "bias", None)
    bias_term = (model.unembed.weight[answer] @ beta) if beta is not None else 0.0  # (B, T)
    ref = logits.gather(-1, answer[..., None])[..., 0]
    for stack in (decompose_resid(model, cache),
                  stack_head_results(model, cache, incl_remainder=True)):
        attrs = logit_attrs(model, cache, stack, answer)  # (n, B, T)
        assert attrs.shape == (stack.shape[0], B, T)
        torch.testing.assert_close(attrs.sum(0) + bias_term, ref, atol=1e-4, rtol=0)
    # A logit difference; one token per example (every position) and one token overall.
    parts = decompose_resid(model, cache)
    other = torch.tensor([3, 5])
    diff = logit_attrs(model, cache, parts, other, incorrect_tokens=torch.tensor([4, 4]))
    ref_diff = logits.gather(-1, other[:, None, None].expand(B, T, 1))[..., 0] - logits[..., 4]
    d_bias = ((model.unembed.weight[other] - model.unembed.weight[4]) @ beta)[:, None] \
        if beta is not None else 0.0
    torch.testing.assert_close(diff.sum(0) + d_bias, ref_diff, atol=1e-4, rtol=0)
    one = logit_attrs(model, cache, parts[:, :, -1], 7, pos_slice=-1)  # last position only
    assert one.shape == (parts.shape[0], B)
    torch.testing.assert_close(one, logit_attrs(model, cache, parts, 7)[:, :, -1], atol=1e-6,
                               rtol=0)


def test_attention_only_model_has_no_mlp_terms() -> None:
    model, _, _, cache = _setup(preset("attn-only-2l"))
    parts, labels = decompose_resid(model, cache, return_labels=True)
    assert labels == ["embed", "pos_embed", "0_attn_out", "1_attn_out"]
    torch.testing.assert_close(parts.sum(0), cache["blocks.1.hook_resid_post"], atol=1e-5,
                               rtol=0)


def test_post_norm_models_are_refused_with_one_line() -> None:
    model, _, _, cache = _setup(preset("tiny-encoder"))
    for call in (lambda: decompose_resid(model, cache),
                 lambda: logit_attrs(model, cache, cache["hook_embed"][None], 1),
                 lambda: stack_head_results(model, cache, apply_ln=True)):
        with pytest.raises(ConfigError, match=r"model\.config\.norm: got 'post', expected "
                                              r"'pre'") as err:
            call()
        assert "\n" not in str(err.value)
    heads = stack_head_results(model, cache)  # per-head results are fine on any model
    assert heads.shape[0] == 2 * 3
    acc = accumulated_resid(model, cache)  # and so are the states themselves
    assert torch.equal(acc[1], cache["blocks.1.hook_resid_pre"])


def test_a_missing_cache_entry_names_the_hook() -> None:
    model = build_model(LN, seed=0).eval()
    tokens = torch.randint(0, LN.vocab_size, (B, T))
    _, cache = model.run_with_cache(tokens, ["hook_embed", "hook_pos_embed"])
    with pytest.raises(KeyError, match="decompose_resid needs 'blocks.0.hook_attn_out'"):
        decompose_resid(model, cache)
    _, part = model.run_with_cache(tokens, ["blocks.0.attn.hook_z"], heads="L0.H1")
    with pytest.raises(KeyError, match="needs every head's 'blocks.0.attn.hook_z'"):
        stack_head_results(model, part, layer=1)
