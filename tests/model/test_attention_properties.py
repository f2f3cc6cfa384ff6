"""Hypothesis property tests: random shapes, GQA groups, RoPE and masks vs explicit maths."""

from __future__ import annotations

import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from ref_attention import full_allowed, make_attention, plan_for, reference_attention
from torch import Tensor

from headwise.hooks import attach_hooks


@st.composite
def cases(draw: st.DrawFn) -> dict:
    n_kv = draw(st.integers(1, 3))
    group = draw(st.integers(1, 3))
    rope = draw(st.booleans())
    d_head = draw(st.sampled_from([2, 4, 6] if rope else [1, 2, 3, 5]))
    return {
        "B": draw(st.integers(1, 3)), "T": draw(st.integers(1, 7)), "H": n_kv * group,
        "Hkv": n_kv, "Dh": d_head, "D": draw(st.integers(1, 9)), "rope": rope,
        "causal": draw(st.booleans()), "bias": draw(st.booleans()),
        "padding": draw(st.booleans()), "head_mask": draw(st.sampled_from(
            ["none", "H", "1", "BH"])), "seed": draw(st.integers(0, 2**16)),
        "explicit": draw(st.sampled_from(["none", "all", "some"])),
    }


@settings(max_examples=60, deadline=None)
@given(cases())
def test_attention_matches_explicit_maths(c: dict) -> None:
    g = torch.Generator().manual_seed(c["seed"])
    B, T, H = c["B"], c["T"], c["H"]
    torch.manual_seed(c["seed"])
    attn = make_attention(c["D"], H, c["Hkv"], c["Dh"], causal=c["causal"], bias=c["bias"],
                          rope=c["rope"]).eval()
    x = torch.randn(B, T, c["D"], generator=g)
    kp = torch.rand(B, T, generator=g) > 0.3 if c["padding"] else None
    mask: Tensor | None = None
    if c["head_mask"] != "none":
        shape = {"H": (H, T, T), "1": (1, T, T), "BH": (B, H, T, T)}[c["head_mask"]]
        mask = torch.rand(shape, generator=g) > 0.4
        attn.head_mask = lambda t, task, dev: mask
    full_mask = None if mask is None else mask.expand(*mask.shape[:-3], H, T, T)
    allowed = full_allowed(B, H, T, c["causal"], kp, full_mask)
    ref_out, ref_z, ref_pattern = reference_attention(attn, x, allowed,
                                                      1e4 if c["rope"] else None)
    heads = {"none": None, "all": tuple(range(H)), "some": tuple(range(0, H, 2))}[c["explicit"]]
    zs: list[Tensor] = []
    patterns: list[Tensor] = []
    hooks = [("hook_z", lambda z, ctx: zs.append(z))]
    if heads is not None:
        hooks.append(("hook_pattern", lambda p, ctx: patterns.append(p), heads))
    with attach_hooks(attn, hooks):
        out = attn(x, plan_for(attn, kp))
    assert not out.isnan().any()
    torch.testing.assert_close(out, ref_out, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(zs[0], ref_z, atol=1e-5, rtol=1e-5)
    if heads is not None:
        torch.testing.assert_close(patterns[0], ref_pattern[:, list(heads)], atol=1e-5,
                                   rtol=1e-5)
