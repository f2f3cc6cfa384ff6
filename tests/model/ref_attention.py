"""Independent references for the model tests: explicit per-head attention maths and helpers.

Written from the formulas (Vaswani et al. 2017; Su et al. 2021 for RoPE), one head and one
example at a time, so that no batched transpose or broadcast of the code under test is reused.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from headwise.model import Attention
from headwise.model.hook_point import HookPoint
from headwise.model.mask_plan import MaskPlan, mask_plan


def rope_reference(x: Tensor, base: float = 10000.0) -> Tensor:
    """Rotate ``x`` (T, Dh): pair (i, i + Dh/2) rotated by angle ``t * base^(-2i/Dh)``."""
    T, Dh = x.shape
    half = Dh // 2
    out = x.clone()
    for t in range(T):
        for i in range(half):
            theta = t * base ** (-2.0 * i / Dh)
            a, b = x[t, i], x[t, i + half]
            out[t, i] = a * math.cos(theta) - b * math.sin(theta)
            out[t, i + half] = b * math.cos(theta) + a * math.sin(theta)
    return out


def reference_attention(attn: Attention, x: Tensor, allowed: Tensor,
                        rope_base: float | None = None) -> tuple[Tensor, Tensor, Tensor]:
    """Explicit multi-head attention with ``attn``'s weights.

    Args:
        attn: the module whose q/k/v/o Linear weights to use.
        x: (B, T, D) input.
        allowed: (B, H, T, T) bool, True = query may attend to key.
        rope_base: apply rotary embeddings with this base, or ``None``.

    Returns:
        (out (B, T, D), z (B, T, H, Dh), pattern (B, H, T, T)); rows without an allowed key
        have zero pattern and zero z.
    """
    B, T, _ = x.shape
    H, Hkv, Dh = attn.n_heads, attn.n_kv_heads, attn.d_head
    group = H // Hkv

    def rows(lin: nn.Linear, g: int) -> tuple[Tensor, Tensor | None]:
        w = lin.weight[g * Dh:(g + 1) * Dh]
        b = lin.bias[g * Dh:(g + 1) * Dh] if lin.bias is not None else None
        return w, b

    def proj(xb: Tensor, lin: nn.Linear, g: int) -> Tensor:
        w, b = rows(lin, g)
        y = xb @ w.T
        return y + b if b is not None else y

    z = torch.zeros(B, T, H, Dh, dtype=x.dtype)
    pattern = torch.zeros(B, H, T, T, dtype=x.dtype)
    for b in range(B):
        for h in range(H):
            g = h // group
            q = proj(x[b], attn.q_proj, h)  # (T, Dh)
            k = proj(x[b], attn.k_proj, g)
            v = proj(x[b], attn.v_proj, g)
            if rope_base is not None:
                q, k = rope_reference(q, rope_base), rope_reference(k, rope_base)
            for i in range(T):
                keys = [j for j in range(T) if bool(allowed[b, h, i, j])]
                if not keys:
                    continue  # no allowed key: zero row
                s = torch.stack([q[i] @ k[j] for j in keys]) / math.sqrt(Dh)
                p = torch.softmax(s, dim=0)
                for n, j in enumerate(keys):
                    pattern[b, h, i, j] = p[n]
                    z[b, i, h] = z[b, i, h] + p[n] * v[j]
    o = attn.o_proj
    out = z.reshape(B, T, H * Dh) @ o.weight.T
    if o.bias is not None:
        out = out + o.bias
    return out, z, pattern


def make_attention(D: int, H: int, Hkv: int, Dh: int, *, causal: bool, bias: bool = True,
                   rope: bool = False, max_seq_len: int = 16,
                   dtype: torch.dtype = torch.float32) -> Attention:
    """A standalone Attention from its leaves, with named hook points."""
    from headwise.model import Rotary

    attn = Attention(
        nn.Linear(D, H * Dh, bias=bias), nn.Linear(D, Hkv * Dh, bias=bias),
        nn.Linear(D, Hkv * Dh, bias=bias), nn.Linear(H * Dh, D, bias=bias),
        n_heads=H, n_kv_heads=Hkv, d_head=Dh, causal=causal,
        rotary=Rotary(Dh, max_seq_len) if rope else None,
    ).to(dtype)
    name_points(attn)
    return attn


def name_points(module: nn.Module) -> None:
    """Give a standalone module's hook points their module-path names (the model does this)."""
    for name, m in module.named_modules():
        if isinstance(m, HookPoint):
            m.name = name


def full_allowed(B: int, H: int, T: int, causal: bool, key_padding: Tensor | None = None,
                 head_mask: Tensor | None = None) -> Tensor:
    """The (B, H, T, T) allowed mask, built element by element."""
    out = torch.ones(B, H, T, T, dtype=torch.bool)
    for b in range(B):
        for h in range(H):
            for i in range(T):
                for j in range(T):
                    ok = not (causal and j > i)
                    if key_padding is not None:
                        ok = ok and bool(key_padding[b, j])
                    if head_mask is not None:
                        m = head_mask if head_mask.dim() == 4 else head_mask[None]
                        ok = ok and bool(m[b if m.shape[0] > 1 else 0, h, i, j])
                    out[b, h, i, j] = ok
    return out


def plan_for(attn: Attention, key_padding: Tensor | None) -> MaskPlan | None:
    """The mask plan a model's forward gives ``attn`` for ``key_padding`` (B, T)."""
    if key_padding is None:
        return None
    return mask_plan(key_padding.shape[1], attn.causal, key_padding)


def fused_from(module: nn.Module, max_keys: int = 0) -> nn.Module:
    """Set ``explicit_max_keys`` of every attention layer in ``module`` (0: the fused / split
    machinery at every length, where short hooked sequences otherwise run every head
    explicitly); returns ``module``."""
    for m in module.modules():
        if isinstance(m, Attention):
            m.explicit_max_keys = max_keys
    return module
