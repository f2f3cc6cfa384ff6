"""Per-head weights ``model.W_Q`` ... ``QK`` against TransformerLens's definition of attention.

TransformerLens (not installed here) computes a head, with its stacked weights, as::

    q[b,p,h] = x[b,p] @ W_Q[l,h] + b_Q[l,h]   (k, v alike; GQA: W_K[l,h] is kv head h//group)
    scores = q . k / sqrt(Dh),  z = softmax(scores) @ v
    attn_out = sum_h z[b,p,h] @ W_O[l,h] + b_O[l]

Those formulas are written out below with einsum on our properties and compared with the
model's own forward values (captured by its hook points); PyTorch forward hooks on the Linear
layers give the attention input independently.
"""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from headwise.config import ModelConfig
from headwise.control import apply_lora
from headwise.model import build_model

# GPT-2-like with biases, learned positions (no RoPE: the full attention formula applies).
GPT = ModelConfig(n_layers=2, n_heads=3, d_model=14, d_head=4, d_ff=22, vocab_size=19,
                  max_seq_len=12)
# Llama-like: 6 query heads on 2 kv heads, RoPE, no biases.
GQA = ModelConfig(n_layers=2, n_heads=6, n_kv_heads=2, d_model=20, d_head=8, d_ff=28,
                  vocab_size=23, max_seq_len=12, positional="rope", norm_type="rmsnorm",
                  activation="swiglu", bias="none")


def _randomise_biases(model: nn.Module) -> None:
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("bias"):
                p.normal_(0, 0.5)


def _attn_input(model: nn.Module, layer: int, tokens: torch.Tensor) -> torch.Tensor:
    seen = {}
    handle = model.blocks[layer].attn.q_proj.register_forward_hook(
        lambda mod, inp, out: seen.update(x=inp[0]))
    with torch.no_grad():
        model(tokens)
    handle.remove()
    return seen["x"]  # (B, T, D)


@pytest.mark.parametrize("cfg", [GPT, GQA], ids=["gpt2-bias", "gqa-rope"])
def test_shapes_follow_transformerlens(cfg: ModelConfig) -> None:
    m = build_model(cfg, seed=0)
    L, H, D, Dh = cfg.n_layers, cfg.n_heads, cfg.d_model, cfg.d_head
    for name in ("W_Q", "W_K", "W_V"):
        assert getattr(m, name).shape == (L, H, D, Dh)
    assert m.W_O.shape == (L, H, Dh, D)
    for name in ("b_Q", "b_K", "b_V"):
        assert getattr(m, name).shape == (L, H, Dh)
    assert m.b_O.shape == (L, D)
    assert m.OV.shape == m.QK.shape == (L, H, D, D)
    assert m.W_E.shape == (cfg.vocab_size, D) and m.W_U.shape == (D, cfg.vocab_size)


def test_transformerlens_attention_formula_reproduces_the_forward() -> None:
    model = build_model(GPT, seed=0).eval()
    _randomise_biases(model)
    tokens = torch.randint(0, GPT.vocab_size, (2, 9), generator=torch.Generator().manual_seed(1))
    x = _attn_input(model, 1, tokens)
    names = [f"blocks.1.attn.hook_{n}" for n in ("q", "k", "v", "pattern", "z")]
    _, cache = model.run_with_cache(tokens, names + ["blocks.1.hook_attn_out"])
    l = 1
    q = torch.einsum("bpd,hdk->bphk", x, model.W_Q[l]) + model.b_Q[l]
    k = torch.einsum("bpd,hdk->bphk", x, model.W_K[l]) + model.b_K[l]
    v = torch.einsum("bpd,hdk->bphk", x, model.W_V[l]) + model.b_V[l]
    scores = torch.einsum("bqhk,bshk->bhqs", q, k) / math.sqrt(GPT.d_head)
    scores = scores.masked_fill(~torch.ones(9, 9, dtype=torch.bool).tril(), float("-inf"))
    pattern = scores.softmax(-1)
    z = torch.einsum("bhqs,bshk->bqhk", pattern, v)
    attn_out = torch.einsum("bphk,hkd->bpd", z, model.W_O[l]) + model.b_O[l]
    with torch.no_grad():
        for ours, ref in ((q, "q"), (k, "k"), (v, "v"), (pattern, "pattern"), (z, "z")):
            torch.testing.assert_close(ours, cache[f"blocks.1.attn.hook_{ref}"],
                                       atol=1e-5, rtol=0)
        torch.testing.assert_close(attn_out, cache["blocks.1.hook_attn_out"], atol=1e-5, rtol=0)


@pytest.mark.parametrize("lora", [False, True])
def test_gqa_kv_weights_are_expanded_to_query_heads(lora: bool) -> None:
    model = build_model(GQA, seed=0).eval()
    if lora:  # the properties hold the effective (adapted) weights
        apply_lora(model, targets=("q_proj", "k_proj", "v_proj", "o_proj"), heads="L1.H4",
                   rank=2)
        for name, p in model.named_parameters():
            if "lora_B" in name:
                torch.nn.init.normal_(p, std=0.5)
    tokens = torch.randint(0, GQA.vocab_size, (2, 7), generator=torch.Generator().manual_seed(2))
    x = _attn_input(model, 1, tokens)
    _, cache = model.run_with_cache(tokens, [f"blocks.1.attn.hook_{n}" for n in "qkvz"]
                                    + ["blocks.1.hook_attn_out"])
    with torch.no_grad():
        q = torch.einsum("bpd,hdk->bphk", x, model.W_Q[1])
        k = torch.einsum("bpd,hdk->bphk", x, model.W_K[1])
        v = torch.einsum("bpd,hdk->bphk", x, model.W_V[1])
        out = torch.einsum("bphk,hkd->bpd", cache["blocks.1.attn.hook_z"], model.W_O[1])
    torch.testing.assert_close(q, cache["blocks.1.attn.hook_q"], atol=1e-5, rtol=0)
    kv_of = [h // 3 for h in range(6)]  # HF repeat_kv order, by hand
    torch.testing.assert_close(k, cache["blocks.1.attn.hook_k"][:, :, kv_of], atol=1e-5, rtol=0)
    torch.testing.assert_close(v, cache["blocks.1.attn.hook_v"][:, :, kv_of], atol=1e-5, rtol=0)
    torch.testing.assert_close(out, cache["blocks.1.hook_attn_out"], atol=1e-5, rtol=0)


def test_ov_and_qk_are_the_circuit_products() -> None:
    cfg = GPT.replace(bias="none")
    model = build_model(cfg, seed=0).eval()
    tokens = torch.randint(0, cfg.vocab_size, (2, 8), generator=torch.Generator().manual_seed(3))
    x = _attn_input(model, 0, tokens)
    _, cache = model.run_with_cache(tokens, ["blocks.0.attn.hook_attn_scores"])
    with torch.no_grad():
        ov, qk = model.OV, model.QK
        torch.testing.assert_close(ov.AB, model.W_V @ model.W_O, atol=1e-6, rtol=0)
        # Scores from the residual alone: x_q QK x_k^T / sqrt(Dh), with no bias or RoPE.
        scores = torch.einsum("bqd,hde,bke->bhqk", x, qk.AB[0], x) / math.sqrt(cfg.d_head)
    allowed = torch.ones(8, 8, dtype=torch.bool).tril()
    ref = cache["blocks.0.attn.hook_attn_scores"]
    torch.testing.assert_close(scores[..., allowed], ref[..., allowed], atol=1e-5, rtol=0)
    assert ov[1, 2].shape == (cfg.d_model, cfg.d_model)
    torch.testing.assert_close(ov[1, 2].AB, model.W_V[1, 2] @ model.W_O[1, 2], atol=0, rtol=0)
