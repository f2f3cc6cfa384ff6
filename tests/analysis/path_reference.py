"""An explicit forward pass written from a model's weights, with any receiver's input stream
replaced: the independent reference of path patching.

``forward(model, tokens, replace, mask, gate)`` computes embeddings, LayerNorm, per-head
q/k/v (kv heads under GQA), scaled causal scores, softmax, ``z``, each head's ``z W_O[h]``, the
GELU MLP, residual adds in pre- or post-norm order and the unembedding, with plain tensor
maths. ``replace`` maps a receiver to the residual stream it reads instead of the current one
(before its norm in pre-norm models): ``("q", l, h)``, ``("k", l, g)`` and ``("v", l, g)``
(``g`` a kv head), ``("mlp", l)``, ``("logits",)``. The returned ``Record`` holds every
intermediate value a test needs to build those streams.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import Tensor


@dataclass
class Record:
    x: list[Tensor] = field(default_factory=list)         # block inputs (B, T, D)
    results: list[Tensor] = field(default_factory=list)   # (H, B, T, D) per layer
    attn_out: list[Tensor] = field(default_factory=list)  # (B, T, D)
    y: list[Tensor] = field(default_factory=list)         # the MLP's stream (before ln2 if pre)
    mlp_out: list[Tensor] = field(default_factory=list)
    final: Tensor | None = None                           # the stream the logits read
    logits: Tensor | None = None


def layer_norm(x: Tensor, mod: object, eps: float) -> Tensor:
    mu = x.mean(-1, keepdim=True)
    var = ((x - mu) ** 2).mean(-1, keepdim=True)
    return (x - mu) / torch.sqrt(var + eps) * mod.weight + mod.bias  # type: ignore[attr-defined]


def forward(model: object, tokens: Tensor, replace: dict | None = None,
            mask: dict | None = None, gate: dict | None = None) -> Record:
    """``mask[(l, h)]``: (T, T) bool of allowed keys besides causality; ``gate[(l, h)]``: the
    head's output factor."""
    m: object = model
    cfg = m.config  # type: ignore[attr-defined]
    replace, mask, gate = replace or {}, mask or {}, gate or {}
    B, T = tokens.shape
    H, Hkv, Dh, D = cfg.n_heads, cfg.n_kv_heads, cfg.d_head, cfg.d_model
    eps = cfg.norm_eps
    pre = cfg.norm == "pre"
    rec = Record()
    x = m.embed.weight[tokens] + m.pos_embed.weight[:T]  # type: ignore[attr-defined]
    causal = torch.ones(T, T, dtype=torch.bool).tril()
    for l, block in enumerate(m.blocks):  # type: ignore[attr-defined]
        rec.x.append(x)
        a = block.attn
        Wq, Wk = a.q_proj.weight.view(H, Dh, D), a.k_proj.weight.view(Hkv, Dh, D)
        Wv, Wo = a.v_proj.weight.view(Hkv, Dh, D), a.o_proj.weight.view(D, H, Dh)
        bq, bk, bv = (a.q_proj.bias.view(H, Dh), a.k_proj.bias.view(Hkv, Dh),
                      a.v_proj.bias.view(Hkv, Dh))

        def inp(key: tuple, x: Tensor = x, block: object = block) -> Tensor:
            s = replace.get(key, x)
            return layer_norm(s, block.ln1, eps) if pre else s  # type: ignore[attr-defined]

        results = []
        for h in range(H):
            g = h // (H // Hkv)
            q = inp(("q", l, h)) @ Wq[h].T + bq[h]
            k = inp(("k", l, g)) @ Wk[g].T + bk[g]
            v = inp(("v", l, g)) @ Wv[g].T + bv[g]
            scores = q @ k.transpose(-1, -2) / math.sqrt(Dh)
            allowed = causal & mask.get((l, h), torch.ones(T, T, dtype=torch.bool))
            scores = scores.masked_fill(~allowed, float("-inf"))
            p = torch.softmax(scores, -1).nan_to_num(0.0)
            z = p @ v * gate.get((l, h), 1.0)
            results.append(z @ Wo[:, h].T)
        rec.results.append(torch.stack(results))
        attn_out = torch.stack(results).sum(0) + a.o_proj.bias
        rec.attn_out.append(attn_out)
        if pre:
            y = x + attn_out
            rec.y.append(y)
            mlp_in = layer_norm(replace.get(("mlp", l), y), block.ln2, eps)
        else:
            y = layer_norm(x + attn_out, block.ln1, eps)
            rec.y.append(y)
            mlp_in = replace.get(("mlp", l), y)
        mlp = block.mlp
        out = F.gelu(mlp_in @ mlp.up_proj.weight.T + mlp.up_proj.bias) @ mlp.down_proj.weight.T
        out = out + mlp.down_proj.bias
        rec.mlp_out.append(out)
        x = y + out if pre else layer_norm(y + out, block.ln2, eps)
    rec.final = x
    s = replace.get(("logits",), x)
    hidden = layer_norm(s, m.ln_final, eps) if pre else s  # type: ignore[attr-defined]
    rec.logits = hidden @ m.unembed.weight.T  # type: ignore[attr-defined]
    return rec
