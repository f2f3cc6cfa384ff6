"""A plain nanoGPT-style decoder (fused QKV, SDPA ``is_causal=True``): the speed reference.

Written after karpathy/nanoGPT ``model.py`` with no hook machinery at all, so that
``bench_forward.py`` can measure what headwise's hook points and path selection cost.
``load_from_headwise`` copies a headwise GPT-2-shaped model's weights in, so that both
systems compute the same function (the benchmark asserts it).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn


class CausalSelfAttention(nn.Module):
    """Fused ``c_attn`` (D -> 3D), SDPA with ``is_causal=True``, ``c_proj`` (D -> D)."""

    def __init__(self, d_model: int, n_heads: int) -> None:
        super().__init__()
        self.n_heads = n_heads
        self.c_attn = nn.Linear(d_model, 3 * d_model)
        self.c_proj = nn.Linear(d_model, d_model)

    def forward(self, x: Tensor) -> Tensor:  # (B, T, D) -> (B, T, D)
        B, T, D = x.shape
        q, k, v = self.c_attn(x).split(D, dim=2)
        q = q.view(B, T, self.n_heads, D // self.n_heads).transpose(1, 2)  # (B, H, T, Dh)
        k = k.view(B, T, self.n_heads, D // self.n_heads).transpose(1, 2)
        v = v.view(B, T, self.n_heads, D // self.n_heads).transpose(1, 2)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)  # (B, H, T, Dh)
        return self.c_proj(y.transpose(1, 2).contiguous().view(B, T, D))


class Block(nn.Module):
    """Pre-norm block: ``x + attn(ln_1(x))``, ``x + mlp(ln_2(x))`` with GELU (tanh)."""

    def __init__(self, d_model: int, n_heads: int, d_ff: int) -> None:
        super().__init__()
        self.ln_1 = nn.LayerNorm(d_model)
        self.attn = CausalSelfAttention(d_model, n_heads)
        self.ln_2 = nn.LayerNorm(d_model)
        self.c_fc = nn.Linear(d_model, d_ff)
        self.c_proj = nn.Linear(d_ff, d_model)

    def forward(self, x: Tensor) -> Tensor:  # (B, T, D) -> (B, T, D)
        x = x + self.attn(self.ln_1(x))
        return x + self.c_proj(F.gelu(self.c_fc(self.ln_2(x)), approximate="tanh"))


class GPT(nn.Module):
    """Token + learned position embeddings, blocks, final LayerNorm, tied LM head."""

    def __init__(self, n_layers: int, d_model: int, n_heads: int, d_ff: int, vocab_size: int,
                 max_seq_len: int) -> None:
        super().__init__()
        self.wte = nn.Embedding(vocab_size, d_model)
        self.wpe = nn.Embedding(max_seq_len, d_model)
        self.h = nn.ModuleList(Block(d_model, n_heads, d_ff) for _ in range(n_layers))
        self.ln_f = nn.LayerNorm(d_model)
        self.lm_head = nn.Linear(d_model, vocab_size, bias=False)
        self.lm_head.weight = self.wte.weight  # weight tying, as GPT-2

    def forward(self, idx: Tensor) -> Tensor:  # (B, T) long -> (B, T, V)
        T = idx.shape[1]
        pos = torch.arange(T, device=idx.device)
        x = self.wte(idx) + self.wpe(pos)
        for block in self.h:
            x = block(x)
        return self.lm_head(self.ln_f(x))


@torch.no_grad()
def load_from_headwise(ref: GPT, model: Any) -> None:
    """Copy a headwise pre-norm, learned-position, tied, bias="all" model into ``ref``."""
    ref.wte.weight.copy_(model.embed.weight)
    ref.wpe.weight.copy_(model.pos_embed.weight[: ref.wpe.weight.shape[0]])
    for theirs_block, ours in zip(ref.h, model.blocks, strict=True):
        theirs: Any = theirs_block
        a = ours.attn
        theirs.attn.c_attn.weight.copy_(torch.cat([a.q_proj.weight, a.k_proj.weight,
                                                   a.v_proj.weight]))
        theirs.attn.c_attn.bias.copy_(torch.cat([a.q_proj.bias, a.k_proj.bias, a.v_proj.bias]))
        theirs.attn.c_proj.load_state_dict(a.o_proj.state_dict())
        theirs.ln_1.load_state_dict(ours.ln1.state_dict())
        theirs.ln_2.load_state_dict(ours.ln2.state_dict())
        theirs.c_fc.load_state_dict(ours.mlp.up_proj.state_dict())
        theirs.c_proj.load_state_dict(ours.mlp.down_proj.state_dict())
    ref.ln_f.load_state_dict(model.ln_final.state_dict())
