"""Parity with PyTorch's own modules: nn.MultiheadAttention and nn.TransformerEncoderLayer.

Weights are copied from the torch module into ours (``in_proj_weight`` splits into q/k/v).
Torch masks use True = masked out; ours use True = keep, so every mask is inverted once.
"""

from __future__ import annotations

import pytest
import torch
from ref_attention import make_attention, plan_for
from torch import Tensor, nn

from headwise.config import ModelConfig
from headwise.model import MLP, Attention, LayerNorm, PostNormBlock, PreNormBlock, build_model

B, T, H, Dh = 2, 5, 3, 4
D = H * Dh  # 12; MultiheadAttention needs D = H * Dh
F = 20
TOL = 1e-5


@torch.no_grad()
def copy_mha(mha: nn.MultiheadAttention, attn: Attention) -> None:
    w, b = mha.in_proj_weight, mha.in_proj_bias
    for i, lin in enumerate((attn.q_proj, attn.k_proj, attn.v_proj)):
        lin.weight.copy_(w[i * D:(i + 1) * D])
        lin.bias.copy_(b[i * D:(i + 1) * D])
    attn.o_proj.weight.copy_(mha.out_proj.weight)
    attn.o_proj.bias.copy_(mha.out_proj.bias)


@torch.no_grad()
def copy_encoder_layer(layer: nn.TransformerEncoderLayer, block: nn.Module) -> None:
    copy_mha(layer.self_attn, block.attn)
    block.mlp.up_proj.load_state_dict(layer.linear1.state_dict())
    block.mlp.down_proj.load_state_dict(layer.linear2.state_dict())
    for ours, theirs in ((block.ln1, layer.norm1), (block.ln2, layer.norm2)):
        ours.weight.copy_(theirs.weight)
        ours.bias.copy_(theirs.bias)


def randomise(module: nn.Module) -> None:
    """Non-trivial norm affines and biases, so a missing bias or affine cannot pass."""
    with torch.no_grad():
        for p in module.parameters():
            p.copy_(torch.randn_like(p) * 0.3 + (1.0 if p.dim() == 1 else 0.0) * 0.5)


def padding() -> Tensor:
    return torch.tensor([[1, 1, 1, 1, 1], [1, 1, 1, 0, 0]], dtype=torch.bool)  # True = real


def attn_mask() -> Tensor:
    keep = torch.rand(T, T) > 0.4
    return keep | torch.eye(T, dtype=torch.bool)  # every query keeps itself: no empty row


@pytest.mark.parametrize("use_padding", [False, True])
@pytest.mark.parametrize("mask_kind", ["none", "shared", "per_head"])
def test_attention_equals_multihead_attention(use_padding: bool, mask_kind: str) -> None:
    mha = nn.MultiheadAttention(D, H, batch_first=True).eval()
    randomise(mha)
    attn = make_attention(D, H, H, Dh, causal=False).eval()
    copy_mha(mha, attn)
    x = torch.randn(B, T, D)
    kp = padding() if use_padding else None
    torch_mask = None
    if mask_kind == "shared":
        keep = attn_mask()  # (T, T)
        attn.head_mask = lambda t, task, dev: keep[None]  # (1, T, T)
        torch_mask = ~keep
    elif mask_kind == "per_head":
        keep4 = torch.stack([torch.stack([attn_mask() for _ in range(H)]) for _ in range(B)])
        attn.head_mask = lambda t, task, dev: keep4  # (B, H, T, T)
        torch_mask = ~keep4.reshape(B * H, T, T)  # torch's 3-D mask is (B*H, T, T)
    ref, _ = mha(x, x, x, key_padding_mask=None if kp is None else ~kp, attn_mask=torch_mask,
                 need_weights=False)
    out = attn(x, plan_for(attn, kp))
    torch.testing.assert_close(out, ref, atol=TOL, rtol=0)


def test_attention_causal_equals_multihead_attention_with_causal_mask() -> None:
    mha = nn.MultiheadAttention(D, H, batch_first=True).eval()
    randomise(mha)
    attn = make_attention(D, H, H, Dh, causal=True).eval()
    copy_mha(mha, attn)
    x = torch.randn(B, T, D)
    causal_block = torch.triu(torch.ones(T, T, dtype=torch.bool), 1)  # True = future, masked
    ref, _ = mha(x, x, x, attn_mask=causal_block, need_weights=False)
    torch.testing.assert_close(attn(x), ref, atol=TOL, rtol=0)
    # padding on top of causal (no row left empty: the first key is always real)
    ref_p, _ = mha(x, x, x, attn_mask=causal_block, key_padding_mask=~padding(),
                   need_weights=False)
    torch.testing.assert_close(attn(x, plan_for(attn, padding())), ref_p, atol=TOL, rtol=0)


def test_attention_patterns_equal_multihead_attention_weights() -> None:
    mha = nn.MultiheadAttention(D, H, batch_first=True).eval()
    randomise(mha)
    attn = make_attention(D, H, H, Dh, causal=False).eval()
    copy_mha(mha, attn)
    x = torch.randn(B, T, D)
    _, weights = mha(x, x, x, key_padding_mask=~padding(), need_weights=True,
                     average_attn_weights=False)  # (B, H, T, T)
    seen: list[Tensor] = []
    from headwise.hooks import attach_hooks

    with attach_hooks(attn, ("hook_pattern", lambda p, ctx: seen.append(p))):
        attn(x, plan_for(attn, padding()))
    torch.testing.assert_close(seen[0], weights, atol=TOL, rtol=0)


def _blocks(norm_first: bool) -> tuple[nn.TransformerEncoderLayer, nn.Module]:
    layer = nn.TransformerEncoderLayer(D, H, dim_feedforward=F, dropout=0.0, batch_first=True,
                                       norm_first=norm_first).eval()
    randomise(layer)
    attn = make_attention(D, H, H, Dh, causal=False)
    mlp = MLP(nn.Linear(D, F), nn.Linear(F, D), "relu")
    cls = PreNormBlock if norm_first else PostNormBlock
    block = cls(attn, mlp, LayerNorm(D), LayerNorm(D)).eval()
    copy_encoder_layer(layer, block)
    return layer, block


@pytest.mark.parametrize("norm_first", [False, True], ids=["post_norm", "pre_norm"])
@pytest.mark.parametrize("masks", ["none", "padding", "padding+attn_mask"])
def test_block_equals_transformer_encoder_layer(norm_first: bool, masks: str) -> None:
    layer, block = _blocks(norm_first)
    x = torch.randn(B, T, D)
    kp = padding() if masks != "none" else None
    src_mask = None
    if masks == "padding+attn_mask":
        keep = attn_mask()
        block.attn.head_mask = lambda t, task, dev: keep[None]
        src_mask = ~keep
    ref = layer(x, src_mask=src_mask, src_key_padding_mask=None if kp is None else ~kp)
    out = block(x, plan_for(block.attn, kp))
    torch.testing.assert_close(out, ref, atol=TOL, rtol=0)


@pytest.mark.parametrize("norm_first", [False, True], ids=["post_norm", "pre_norm"])
def test_causal_block_equals_encoder_layer_with_causal_mask(norm_first: bool) -> None:
    layer = nn.TransformerEncoderLayer(D, H, dim_feedforward=F, dropout=0.0, batch_first=True,
                                       norm_first=norm_first).eval()
    randomise(layer)
    cfg = ModelConfig(n_layers=1, n_heads=H, d_model=D, d_ff=F, vocab_size=7, max_seq_len=T,
                      causal=True, norm="pre" if norm_first else "post", positional="none")
    block = build_model(cfg).blocks[0].eval()
    copy_encoder_layer(layer, block)
    x = torch.randn(B, T, D)
    mask = nn.Transformer.generate_square_subsequent_mask(T)
    ref = layer(x, src_mask=mask, is_causal=True)
    torch.testing.assert_close(block(x), ref, atol=TOL, rtol=0)


@pytest.mark.parametrize("norm_first", [False, True], ids=["post_norm", "pre_norm"])
def test_built_encoder_equals_torch_encoder_stack(norm_first: bool) -> None:
    """build_model wires embeddings -> blocks (-> final norm) like a TransformerEncoder."""
    n_layers, V = 2, 11
    cfg = ModelConfig(n_layers=n_layers, n_heads=H, d_model=D, d_ff=F, vocab_size=V,
                      max_seq_len=T, causal=False, norm="pre" if norm_first else "post",
                      positional="none")
    model = build_model(cfg, seed=1).eval()
    layers = [nn.TransformerEncoderLayer(D, H, F, dropout=0.0, batch_first=True,
                                         norm_first=norm_first).eval() for _ in range(n_layers)]
    for layer, block in zip(layers, model.blocks, strict=True):
        randomise(layer)
        copy_encoder_layer(layer, block)
    tokens = torch.randint(0, V, (B, T))
    h = model.embed(tokens)
    for layer in layers:
        h = layer(h, src_key_padding_mask=~padding())
    if norm_first:
        h = nn.functional.layer_norm(h, (D,), model.ln_final.weight, model.ln_final.bias)
    ref = h @ model.unembed.weight.T
    out = model(tokens, attention_mask=padding().long())
    # torch's fast path may zero padded query rows; compare the real positions
    real = padding()
    torch.testing.assert_close(out[real], ref[real], atol=TOL, rtol=0)
