"""Read-only captures of scores and patterns at lengths past the short-row rule: what each costs
(which kernel runs) and that every capture equals explicit maths.

- Some heads captured: every head runs fused, the captured heads' patterns are computed beside
  it from views of q and k; the output is bit-identical to the no-hook forward.
- Every head captured: one explicit pass whose output is used (no fused call); output and
  gradients equal the no-hook forward's to float rounding.
- Captured scores are the masked scaled scores (the softmax is not written over them when they
  are read); a pattern captured without gradient is the softmax of those scores.
- Every head of a causal layer captured read-only at two query blocks or more, without
  gradient: the pass runs in blocks of queries over the keys each may attend
  (``kernels.causal_blocked``); output and pattern equal explicit maths.
Reference: ``ref_attention.reference_attention`` (per head, per example, from the formulas).
"""

from __future__ import annotations

import itertools
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from ref_attention import full_allowed, make_attention, plan_for, reference_attention
from torch import Tensor

from headwise.hooks import Hook, attach_hooks
from headwise.model import Attention
from headwise.model import attention as attention_module
from headwise.model.attention import EXPLICIT_MAX_KEYS
from headwise.model.kernels import QUERY_BLOCK, causal_blocked

T = EXPLICIT_MAX_KEYS + 5  # 20: past the short-row rule and the CPU softmax's vector width
B = 2
TOL = 1e-5
KINDS = {"mha": (3, 3, False), "gqa_rope": (4, 2, True)}  # H, H_kv, rope


def _setup(kind: str, padding: bool) -> tuple[Attention, Tensor, Tensor | None, Tensor, Tensor]:
    H, Hkv, rope = KINDS[kind]
    attn = make_attention(5 * H, H, Hkv, 5 if not rope else 6, causal=True, rope=rope,
                          max_seq_len=T).eval()
    x = torch.randn(B, T, attn.q_proj.in_features, generator=torch.Generator().manual_seed(4))
    kp = None
    if padding:
        kp = torch.ones(B, T, dtype=torch.bool)
        kp[1, :3] = False  # example 1: first three keys padding
    allowed = full_allowed(B, H, T, True, kp)
    with torch.no_grad():
        ref_out, _, ref_pattern = reference_attention(attn, x, allowed,
                                                      rope_base=1e4 if rope else None)
    return attn, x, kp, ref_out, ref_pattern


def _fused_calls(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    calls: list[int] = []
    sdpa = F.scaled_dot_product_attention

    def counted(*args: Any, **kw: Any) -> Tensor:
        calls.append(args[0].shape[1])  # heads in the call
        return sdpa(*args, **kw)

    monkeypatch.setattr(F, "scaled_dot_product_attention", counted)
    return calls


def _capture(heads: tuple[int, ...] | None, got: dict[str, Tensor],
             points: tuple[str, ...] = ("hook_pattern",)) -> list[Hook]:
    def store(v: Tensor, ctx: Any) -> None:
        got[ctx.name] = v

    return [Hook(p, store, heads, read_only=True) for p in points]


CASES = list(itertools.product(KINDS, [False, True]))


@pytest.mark.parametrize("kind, padding", CASES, ids=[f"{k}-pad{p}" for k, p in CASES])
def test_one_head_capture_is_beside_the_fused_kernel(kind: str, padding: bool,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    attn, x, kp, _, ref_pattern = _setup(kind, padding)
    with torch.no_grad():
        plain = attn(x, plan_for(attn, kp))
        calls = _fused_calls(monkeypatch)
        for h in range(attn.n_heads):
            got: dict[str, Tensor] = {}
            with attach_hooks(attn, _capture((h,), got)):
                out = attn(x, plan_for(attn, kp))
            assert torch.equal(out, plain), h
            assert got["hook_pattern"].shape == (B, 1, T, T)
            torch.testing.assert_close(got["hook_pattern"][:, 0], ref_pattern[:, h],
                                       atol=TOL, rtol=0)
    assert calls == [attn.n_heads] * attn.n_heads  # one fused call over every head each time


@pytest.mark.parametrize("kind, padding", CASES, ids=[f"{k}-pad{p}" for k, p in CASES])
def test_every_head_capture_is_one_explicit_pass(kind: str, padding: bool,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    attn, x, kp, ref_out, ref_pattern = _setup(kind, padding)
    calls = _fused_calls(monkeypatch)
    got: dict[str, Tensor] = {}
    with torch.no_grad(), attach_hooks(attn, _capture(None, got)):
        out = attn(x, plan_for(attn, kp))
    assert calls == []  # no fused call: the explicit pass gives the output
    torch.testing.assert_close(out, ref_out, atol=TOL, rtol=0)
    torch.testing.assert_close(got["hook_pattern"], ref_pattern, atol=TOL, rtol=0)


@pytest.mark.parametrize("kind, padding", CASES, ids=[f"{k}-pad{p}" for k, p in CASES])
@pytest.mark.parametrize("heads", [(1,), None], ids=["one_head", "every_head"])
def test_capture_with_gradient_trains_like_the_no_hook_forward(
        kind: str, padding: bool, heads: tuple[int, ...] | None) -> None:
    """The output's gradient is the no-hook forward's; a loss on the captured pattern adds the
    gradient of the reference pattern's loss (checked through ``torch.autograd.grad``)."""
    attn, x, kp, _, _ = _setup(kind, padding)
    params = [p for p in attn.parameters()]
    plain_grads = torch.autograd.grad(attn(x, plan_for(attn, kp)).square().mean(), params)
    got: dict[str, Tensor] = {}
    with attach_hooks(attn, _capture(heads, got)):
        out = attn(x, plan_for(attn, kp))
    grads = torch.autograd.grad(out.square().mean(), params, retain_graph=True)
    for g, ref in zip(grads, plain_grads, strict=True):
        torch.testing.assert_close(g, ref, atol=TOL, rtol=1e-4)
    # d(pattern . W) against the reference pattern built from the same parameters
    weight = torch.rand(got["hook_pattern"].shape, generator=torch.Generator().manual_seed(5))
    pattern_grads = torch.autograd.grad((got["hook_pattern"] * weight).sum(), params,
                                        allow_unused=True)
    H = attn.n_heads
    allowed = full_allowed(B, H, T, True, kp)
    rope = 1e4 if attn.rotary is not None else None
    ref_pattern = reference_attention(attn, x, allowed, rope_base=rope)[2]
    ref_pattern = ref_pattern if heads is None else ref_pattern[:, list(heads)]
    ref_grads = torch.autograd.grad((ref_pattern * weight).sum(), params, allow_unused=True)
    for g, ref in zip(pattern_grads, ref_grads, strict=True):
        if ref is None:
            assert g is None or g.abs().max() == 0
        else:
            torch.testing.assert_close(g, ref, atol=TOL, rtol=1e-4)


@pytest.mark.parametrize("heads", [(2,), None], ids=["one_head", "every_head"])
def test_captured_scores_are_not_overwritten_by_the_softmax(heads: tuple[int, ...] | None
                                                            ) -> None:
    attn, x, kp, _, ref_pattern = _setup("gqa_rope", padding=False)
    got: dict[str, Tensor] = {}
    with torch.no_grad(), attach_hooks(attn, _capture(heads, got,
                                                      ("hook_attn_scores", "hook_pattern"))):
        attn(x, plan_for(attn, kp))
    scores, pattern = got["hook_attn_scores"], got["hook_pattern"]
    above = torch.ones(T, T, dtype=torch.bool).triu(1)
    assert (scores[..., above] == float("-inf")).all()
    assert torch.isfinite(scores[..., ~above]).all()
    torch.testing.assert_close(torch.softmax(scores, -1), pattern, atol=1e-6, rtol=0)
    want = ref_pattern if heads is None else ref_pattern[:, list(heads)]
    torch.testing.assert_close(pattern, want, atol=TOL, rtol=0)


def test_causal_mask_follows_the_length() -> None:
    """The additive causal mask is kept per length: a shorter call after a longer one (and
    back) is masked for its own length."""
    attn, x, _, ref_out, ref_pattern = _setup("mha", padding=False)
    for t in (T, T - 3, T):
        got: dict[str, Tensor] = {}
        with torch.no_grad(), attach_hooks(attn, _capture(None, got)):
            out = attn(x[:, :t])
        torch.testing.assert_close(got["hook_pattern"], ref_pattern[:, :, :t, :t], atol=TOL,
                                   rtol=0)
        if t == T:
            torch.testing.assert_close(out, ref_out, atol=TOL, rtol=0)


LONG = 2 * QUERY_BLOCK + 7  # three query blocks, the last one short


@pytest.mark.parametrize("kind", list(KINDS))
def test_long_every_head_capture_runs_in_causal_blocks(kind: str,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """At >= two query blocks a read-only, no-gradient capture of every head of a causal layer
    runs ``causal_blocked``; its output and pattern equal the formulas, and a capture that
    needs the full pass (scores read, or padding) does not take it."""
    H, Hkv, rope = KINDS[kind]
    attn = make_attention(5 * H, H, Hkv, 5 if not rope else 6, causal=True, rope=rope,
                          max_seq_len=LONG).eval()
    x = torch.randn(B, LONG, attn.q_proj.in_features, generator=torch.Generator().manual_seed(6))
    with torch.no_grad():
        ref_out, _, ref_pattern = reference_attention(
            attn, x, full_allowed(B, H, LONG, True, None), rope_base=1e4 if rope else None)
    blocked: list[int] = []

    def spy(*args: Any, **kw: Any) -> tuple[Tensor, Tensor]:
        blocked.append(args[0].shape[2])
        return causal_blocked(*args, **kw)

    monkeypatch.setattr(attention_module, "causal_blocked", spy)
    got: dict[str, Tensor] = {}
    with torch.no_grad(), attach_hooks(attn, _capture(None, got)):
        out = attn(x)
    assert blocked == [LONG]
    torch.testing.assert_close(out, ref_out, atol=TOL, rtol=0)
    torch.testing.assert_close(got["hook_pattern"], ref_pattern, atol=TOL, rtol=0)
    kp = torch.ones(B, LONG, dtype=torch.bool)
    kp[1, :3] = False
    with torch.no_grad(), attach_hooks(attn, _capture(None, got, ("hook_attn_scores",
                                                                  "hook_pattern"))):
        attn(x)
        attn(x, plan_for(attn, kp))
    assert blocked == [LONG]  # neither the scores capture nor the padded one was blocked


def test_causal_blocked_equals_the_full_pass() -> None:
    """Each block's rows see only their own keys; the result is the full pass's softmax and
    output, and the pattern above the diagonal is exactly zero."""
    g = torch.Generator().manual_seed(7)
    q, k, v = (torch.randn(2, 3, LONG, 8, generator=g) for _ in range(3))
    bias = torch.full((LONG, LONG), float("-inf")).triu(1)
    scale = 8 ** -0.5
    want = torch.softmax(q @ k.transpose(-1, -2) * scale + bias, -1)
    for block in (QUERY_BLOCK, 16, LONG):
        z, pattern = causal_blocked(q, k, v, bias, scale, block)
        torch.testing.assert_close(pattern, want, atol=1e-6, rtol=0)
        torch.testing.assert_close(z, want @ v, atol=1e-6, rtol=0)
        assert (pattern[..., bias.isinf()] == 0).all()
