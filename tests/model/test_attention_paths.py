"""Fused (SDPA) vs explicit attention: equal outputs, untouched fused heads, empty rows, gradcheck.

The explicit path is forced the way every consumer does it: by attaching a hook to
``hook_pattern`` (all heads or some). Every test runs twice: with the fused / split machinery
forced at this short length, and as shipped (a short hooked sequence runs every head
explicitly). Masks cover causal / padding / per-head (H,T,T) and (B,H,T,T), with and without
GQA and RoPE.
"""

from __future__ import annotations

import itertools

import pytest
import torch
from ref_attention import full_allowed, fused_from, make_attention, plan_for, reference_attention
from torch import Tensor

from headwise.config import ModelConfig
from headwise.hooks import Hook, attach_hooks
from headwise.model import Transformer, build_model
from headwise.model.attention import EXPLICIT_MAX_KEYS

B, T = 2, 5
TOL = 1e-5


@pytest.fixture(params=["fused", "short"])
def max_keys(request: pytest.FixtureRequest) -> int:
    """Each test that takes it twice: with the fused / split machinery at this length
    (``fused``), and as shipped, where a short masked or hooked sequence runs every head
    explicitly (``short``)."""
    return 0 if request.param == "fused" else EXPLICIT_MAX_KEYS


def config(kind: str, causal: bool) -> ModelConfig:
    """``mha`` (learned positions), ``gqa`` (2 kv heads), ``rope``, or ``gqa_rope``."""
    if kind == "mha":
        return ModelConfig(n_layers=2, n_heads=3, d_model=12, d_head=4, d_ff=20, vocab_size=17,
                           max_seq_len=8, causal=causal)
    return ModelConfig(n_layers=2, n_heads=4, n_kv_heads=2 if "gqa" in kind else 4, d_model=24,
                       d_head=6, d_ff=40, vocab_size=19, max_seq_len=8, causal=causal,
                       positional="rope" if "rope" in kind else "learned",
                       norm_type="rmsnorm", activation="swiglu", bias="none")


def padding_mask() -> Tensor:
    # example 1: first two keys padding (with causal, query 0 and 1 have no key at all)
    return torch.tensor([[1, 1, 1, 1, 1], [0, 0, 1, 1, 1]])


def head_mask(kind: str, H: int) -> Tensor | None:
    if kind == "none":
        return None
    g = torch.Generator().manual_seed(3)
    shape = (H, T, T) if kind == "per_head" else (B, H, T, T)
    m = torch.rand(shape, generator=g) > 0.35
    if kind == "per_head_batch":
        m[..., 0, :] = False  # query 0 has no allowed key in any head
    return m


def set_head_mask(model: Transformer, mask: Tensor | None) -> None:
    for block in model.blocks:
        block.attn.head_mask = None if mask is None else (lambda t, task, dev, m=mask: m)


def run(model: Transformer, tokens: Tensor, am: Tensor | None,
        explicit: dict[int, tuple[int, ...] | None]) -> tuple[Tensor, dict[str, Tensor]]:
    """Forward with hook_pattern hooks on the given layers (heads or None = all); cache z."""
    hooks = [Hook(f"blocks.{l}.attn.hook_pattern", lambda p, ctx: None, heads)
             for l, heads in explicit.items()]
    names = [f"blocks.{l}.attn.hook_z" for l in range(len(model.blocks))]
    with model.hooks(hooks):
        return model.run_with_cache(tokens, names, attention_mask=am)


CASES = list(itertools.product(["mha", "gqa", "rope", "gqa_rope"], [True, False], [False, True],
                               ["none", "per_head", "per_head_batch"]))


@pytest.mark.parametrize("kind, causal, use_padding, hmask", CASES,
                         ids=["-".join(map(str, c)) for c in CASES])
def test_fused_equals_explicit(kind: str, causal: bool, use_padding: bool, hmask: str,
                               max_keys: int) -> None:
    cfg = config(kind, causal)
    model = fused_from(build_model(cfg, seed=0).eval(), max_keys)
    tokens = torch.randint(0, cfg.vocab_size, (B, T))
    am = padding_mask() if use_padding else None
    set_head_mask(model, head_mask(hmask, cfg.n_heads))
    fused_logits, fused = run(model, tokens, am, {})
    exp_logits, exp = run(model, tokens, am, {0: None, 1: None})
    assert not fused_logits.isnan().any() and not exp_logits.isnan().any()
    torch.testing.assert_close(exp_logits, fused_logits, atol=TOL, rtol=0)
    for name in fused.keys():
        torch.testing.assert_close(exp[name], fused[name], atol=TOL, rtol=0)


@pytest.mark.parametrize("kind, causal, use_padding, hmask", CASES,
                         ids=["-".join(map(str, c)) for c in CASES])
def test_both_paths_equal_explicit_maths(kind: str, causal: bool, use_padding: bool,
                                         hmask: str, max_keys: int) -> None:
    cfg = config(kind, causal)
    H = cfg.n_heads
    attn = make_attention(cfg.d_model, H, cfg.n_kv_heads, cfg.d_head, causal=causal,
                          bias=kind == "mha", rope="rope" in kind).eval()
    fused_from(attn, max_keys)
    x = torch.randn(B, T, cfg.d_model)
    kp = padding_mask().bool() if use_padding else None
    mask = head_mask(hmask, H)
    if mask is not None:
        attn.head_mask = lambda t, task, dev: mask
    allowed = full_allowed(B, H, T, causal, kp, mask)
    ref_out, _, ref_pattern = reference_attention(attn, x, allowed,
                                                  rope_base=1e4 if "rope" in kind else None)
    torch.testing.assert_close(attn(x, plan_for(attn, kp)), ref_out, atol=TOL, rtol=0)
    patterns: list[Tensor] = []
    with attach_hooks(attn, ("hook_pattern", lambda p, ctx: patterns.append(p))):
        out = attn(x, plan_for(attn, kp))
    torch.testing.assert_close(out, ref_out, atol=TOL, rtol=0)
    torch.testing.assert_close(patterns[0], ref_pattern, atol=TOL, rtol=0)


@pytest.mark.parametrize("kind", ["mha", "gqa_rope"])
@pytest.mark.parametrize("explicit_heads", [(1,), (0, 2)])
def test_other_heads_bitwise_equal_when_some_are_explicit(
        kind: str, explicit_heads: tuple[int, ...]) -> None:
    """The split path's promise (longer sequences, or off CPU): a short hooked sequence runs
    every head explicitly instead, so this test forces the split path at this length."""
    cfg = config(kind, causal=True)
    model = fused_from(build_model(cfg, seed=0).eval())
    tokens = torch.randint(0, cfg.vocab_size, (B, T))
    am = padding_mask()
    set_head_mask(model, head_mask("per_head", cfg.n_heads))
    _, fused = run(model, tokens, am, {})
    for layer in range(cfg.n_layers):
        _, part = run(model, tokens, am, {layer: explicit_heads})
        z_fused, z_part = fused[f"blocks.{layer}.attn.hook_z"], part[f"blocks.{layer}.attn.hook_z"]
        for h in range(cfg.n_heads):
            if h in explicit_heads:
                torch.testing.assert_close(z_part[:, :, h], z_fused[:, :, h], atol=TOL, rtol=0)
            else:
                assert torch.equal(z_part[:, :, h], z_fused[:, :, h]), (layer, h)
        # earlier layers are untouched bit for bit
        for earlier in range(layer):
            name = f"blocks.{earlier}.attn.hook_z"
            assert torch.equal(part[name], fused[name])


def test_only_requested_heads_leave_the_fused_path(max_keys: int) -> None:
    model = fused_from(build_model(config("mha", True), seed=0), max_keys)
    seen: list[tuple[int, ...]] = []
    probe = Hook("blocks.1.attn.hook_q",
                 lambda x, ctx: seen.append(model.blocks[1].attn.explicit_heads()))
    tokens = torch.randint(0, 17, (B, T))
    with model.hooks(probe):
        model(tokens)
        with model.hooks(Hook("blocks.1.attn.hook_pattern", lambda p, c: None, (2,)),
                         Hook("blocks.1.attn.hook_attn_scores", lambda p, c: None, (0,))):
            model(tokens)
        with model.hooks(Hook("blocks.1.attn.hook_pattern", lambda p, c: None)):
            model(tokens)
        model(tokens)
    assert seen == [(), (0, 2), (0, 1, 2), ()]


@pytest.mark.parametrize("explicit", [False, True], ids=["fused", "explicit"])
def test_query_without_allowed_key_gives_zeros_and_finite_grads(explicit: bool,
                                                                max_keys: int) -> None:
    cfg = config("gqa_rope", causal=True)
    model = fused_from(build_model(cfg, seed=0), max_keys)
    tokens = torch.randint(0, cfg.vocab_size, (B, T))
    mask = torch.ones(cfg.n_heads, T, T, dtype=torch.bool)
    mask[2, 3, :] = False  # head 2, query 3: no key
    set_head_mask(model, mask)
    hooks = [Hook(f"blocks.{l}.attn.hook_pattern", lambda p, c: None) for l in range(2)]
    names = ["blocks.0.attn.hook_z"] + (["blocks.0.attn.hook_pattern"] if explicit else [])
    with model.hooks(hooks if explicit else []):
        logits, cache = model.run_with_cache(tokens, names, attention_mask=padding_mask())
    assert not logits.isnan().any()
    z = cache["blocks.0.attn.hook_z"]  # (B, T, H, Dh)
    assert torch.equal(z[1, :2], torch.zeros_like(z[1, :2]))  # padding + causal: no key
    assert torch.equal(z[:, 3, 2], torch.zeros_like(z[:, 3, 2]))  # per-head empty row
    assert z[0, 0].abs().sum() > 0  # and a normal row is not zero
    if explicit:
        pattern = cache["blocks.0.attn.hook_pattern"]
        assert torch.equal(pattern[1, :, :2], torch.zeros_like(pattern[1, :, :2]))
        assert torch.equal(pattern[:, 2, 3], torch.zeros_like(pattern[:, 2, 3]))
    with model.hooks(hooks if explicit else []):
        model(tokens, attention_mask=padding_mask()).square().mean().backward()
    for name, p in model.named_parameters():
        assert p.grad is not None and torch.isfinite(p.grad).all(), name


@pytest.mark.parametrize("explicit", [False, True], ids=["fused", "explicit"])
@pytest.mark.parametrize("kind", ["mha", "gqa_rope"])
def test_gradcheck_float64(explicit: bool, kind: str, max_keys: int) -> None:
    H, Hkv, Dh, D, Tg = (3, 3, 2, 5, 4) if kind == "mha" else (4, 2, 2, 6, 4)
    attn = make_attention(D, H, Hkv, Dh, causal=True, rope=kind != "mha",
                          dtype=torch.float64)
    fused_from(attn, max_keys)
    mask = torch.ones(H, Tg, Tg, dtype=torch.bool)
    mask[1, 2, :] = False  # an empty row: zeros and zero gradient, not NaN
    mask[0, 3, 0] = False
    attn.head_mask = lambda t, task, dev: mask
    kp = plan_for(attn, torch.tensor([[True, True, True, True], [False, True, True, True]]))
    x = torch.randn(2, Tg, D, dtype=torch.float64, requires_grad=True)
    hooks = [("hook_pattern", lambda p, c: None)] if explicit else []
    with attach_hooks(attn, hooks):
        assert torch.autograd.gradcheck(lambda inp: attn(inp, kp), (x,))
        # gradients w.r.t. the projection weights too
        w = attn.q_proj.weight

        def through_weight(weight: Tensor) -> Tensor:
            return torch.func.functional_call(attn, {"q_proj.weight": weight}, (x.detach(), kp))

        assert torch.autograd.gradcheck(through_weight, (w.detach().clone().requires_grad_(),))
