"""Short sequences, read-only hooks and ``softmax_keys``: which path attention takes, and that
every path gives the numbers of the others and of explicit maths.

- A sequence of at most ``EXPLICIT_MAX_KEYS`` tokens on CPU with hooks on some heads' patterns
  runs every head of that layer explicitly; without hooks (masks or not) it stays on the fused
  kernel. Reference: the same model with the fused / split machinery forced.
- Read-only hooks (captures) leave the forward's outputs bit-identical to the no-hook forward
  (the patterns are computed beside the fused kernel) and a loss on a captured pattern trains
  q and k exactly as on the explicit path. Reference: a writing hook (explicit path).
- ``softmax_keys`` pads short CPU rows: equal to ``torch.softmax`` with its gradient.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from ref_attention import fused_from
from test_attention_paths import TOL, config, head_mask, padding_mask, set_head_mask
from torch import Tensor, nn

from headwise.hooks import Hook
from headwise.model import build_model
from headwise.model.attention import EXPLICIT_MAX_KEYS
from headwise.model.hook_point import HookPoint
from headwise.model.kernels import softmax_keys

KINDS = ["mha", "gqa_rope"]


def _paths(model: nn.Module, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Record each attention call's path: ``fused`` (an SDPA call), ``explicit:<heads>``."""
    seen: list[str] = []
    sdpa = F.scaled_dot_product_attention

    def fused(*args: Any, **kw: Any) -> Tensor:
        seen.append("fused")
        return sdpa(*args, **kw)

    monkeypatch.setattr(F, "scaled_dot_product_attention", fused)
    for block in model.blocks:  # type: ignore[union-attr]
        original = block.attn._explicit

        def explicit(q, k, v, allowed, heads, original=original):  # type: ignore[no-untyped-def]
            seen.append(f"explicit:{','.join(map(str, heads))}")
            return original(q, k, v, allowed, heads)

        block.attn._explicit = explicit
    return seen


def _forward(model: nn.Module, tokens: Tensor, am: Tensor | None,
             hooks: list[Hook]) -> tuple[Tensor, dict[str, Tensor]]:
    model.zero_grad()
    with model.hooks(hooks):  # type: ignore[operator]
        logits = model(tokens, attention_mask=am)
    logits.square().mean().backward()
    return logits.detach(), {n: p.grad.clone() for n, p in model.named_parameters()
                             if p.grad is not None}


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("case", ["plain", "per_head", "padding", "hook", "hook_per_head",
                                  "hook_padding"])
def test_short_sequence_path_and_numbers(kind: str, case: str,
                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """Hooks on a short sequence put every head of that layer on the explicit path; masks alone
    keep the (masked) fused kernel. Numbers: those of the fused / split machinery."""
    cfg = config(kind, causal=True)
    model = build_model(cfg, seed=0)
    tokens = torch.randint(0, cfg.vocab_size, (2, 5), generator=torch.Generator().manual_seed(1))
    am = padding_mask() if case.endswith("padding") else None
    set_head_mask(model, head_mask("per_head", cfg.n_heads) if case.endswith("per_head")
                  else None)
    hooks = [Hook("blocks.1.attn.hook_pattern", lambda p, ctx: None, (1,))] \
        if case.startswith("hook") else []
    seen = _paths(model, monkeypatch)
    logits, grads = _forward(model, tokens, am, hooks)
    every = "explicit:" + ",".join(map(str, range(cfg.n_heads)))
    assert seen == (["fused", every] if hooks else ["fused", "fused"])
    fused_from(model)
    seen.clear()
    ref_logits, ref_grads = _forward(model, tokens, am, hooks)
    assert seen == (["fused", "fused", "explicit:1"] if hooks else ["fused", "fused"])
    torch.testing.assert_close(logits, ref_logits, atol=TOL, rtol=0)
    for name, g in ref_grads.items():
        torch.testing.assert_close(grads[name], g, atol=TOL, rtol=0, msg=name)


def test_longer_masked_sequence_stays_fused(monkeypatch: pytest.MonkeyPatch) -> None:
    T = EXPLICIT_MAX_KEYS + 1
    cfg = dataclasses.replace(config("mha", causal=True), max_seq_len=T)
    model = build_model(cfg, seed=0)
    mask = torch.ones(cfg.n_heads, T, T, dtype=torch.bool).tril()
    set_head_mask(model, mask)
    seen = _paths(model, monkeypatch)
    with torch.no_grad():
        model(torch.randint(0, cfg.vocab_size, (2, T)))
    assert seen == ["fused", "fused"]


def _capture_model(T: int) -> tuple[nn.Module, Tensor]:
    cfg = dataclasses.replace(config("gqa_rope", causal=True), max_seq_len=T)
    tokens = torch.randint(0, cfg.vocab_size, (2, T), generator=torch.Generator().manual_seed(2))
    return build_model(cfg, seed=0), tokens


def test_read_only_capture_leaves_outputs_bit_identical() -> None:
    model, tokens = _capture_model(EXPLICIT_MAX_KEYS + 8)
    with torch.no_grad():
        ref = model(tokens)
        logits, cache = model.run_with_cache(tokens, ["blocks.1.attn.hook_pattern"], heads="L1.H1")
        _, every = model.run_with_cache(tokens, ["blocks.1.attn.hook_pattern"], detach=False)
    assert torch.equal(logits, ref)
    pattern = cache["blocks.1.attn.hook_pattern"]
    assert pattern.shape[1] == 1
    torch.testing.assert_close(pattern[:, 0], every["blocks.1.attn.hook_pattern"][:, 1],
                               atol=TOL, rtol=0)


def test_loss_on_a_captured_pattern_trains_like_the_explicit_path() -> None:
    """d(task loss + pattern loss) is the same whether the pattern is captured beside the fused
    kernel (read-only) or is on the output's path (a hook that may write)."""
    model, tokens = _capture_model(EXPLICIT_MAX_KEYS + 8)
    T = tokens.shape[1]
    target = torch.eye(T).roll(-1, 1)  # attend to the previous token
    grads = []
    for read_only in (True, False):
        got: list[Tensor] = []
        hook = Hook("blocks.1.attn.hook_pattern", lambda p, ctx, got=got: got.append(p), (2,),
                    read_only=read_only)
        model.zero_grad()
        with model.hooks(hook):
            logits = model(tokens)
        loss = logits.square().mean() - (got[0][:, 0] * target).sum(-1).mean()
        loss.backward()
        grads.append({n: p.grad.clone() for n, p in model.named_parameters()})
    assert any(g.abs().max() > 0 for n, g in grads[0].items() if "q_proj" in n)
    for name, g in grads[1].items():
        torch.testing.assert_close(grads[0][name], g, atol=TOL, rtol=1e-4, msg=name)


def test_read_only_hook_returning_a_value_is_refused() -> None:
    model, tokens = _capture_model(8)
    hook = Hook("blocks.0.attn.hook_z", lambda z, ctx: z * 2, (1,), read_only=True)
    with model.hooks(hook), pytest.raises(ValueError, match="read-only hook at 'blocks.0.attn"):
        model(tokens)


def test_read_only_hook_gets_the_value_itself_when_it_holds_exactly_its_heads() -> None:
    point = HookPoint(head_axis=1)
    point.name = "p"
    got: list[Tensor] = []
    x = torch.randn(2, 2, 3)
    point.attach(Hook("p", lambda v, ctx: got.append(v), (4, 6), read_only=True))
    assert point(x, heads=(4, 6)) is x and got[0] is x
    y = torch.randn(2, 3, 3)
    assert point(y, heads=(4, 5, 6)) is y  # a subset: gathered (a copy), y passed on untouched
    assert torch.equal(got[1], y[:, [0, 2]])


@pytest.mark.parametrize("T", [1, 5, 14, 15, 16, 17, 33])
def test_softmax_keys_equals_softmax(T: int) -> None:
    g = torch.Generator().manual_seed(T)
    x = torch.randn(3, 2, T, T, generator=g)
    x = x.masked_fill(~torch.ones(T, T, dtype=torch.bool).tril(), float("-inf"))
    a, b = x.clone().requires_grad_(), x.clone().requires_grad_()
    out, ref = softmax_keys(a), torch.softmax(b, -1)
    assert out.shape == ref.shape and out.is_contiguous()
    torch.testing.assert_close(out, ref, atol=1e-6, rtol=0)
    w = torch.randn(out.shape, generator=g)
    (out * w).sum().backward()
    (ref * w).sum().backward()
    torch.testing.assert_close(a.grad, b.grad, atol=1e-6, rtol=0)
