"""Hooks: attach/detach with ``with``, run_with_cache contents, backward hooks, errors."""

from __future__ import annotations

import pytest
import torch
from torch import Tensor

from headwise.config import preset
from headwise.hooks import Hook, HookContext
from headwise.model import Transformer, build_model


@pytest.fixture
def model() -> Transformer:
    return build_model(preset("tiny"), seed=0)  # L=2, H=3, Dh=4, D=12, V=17


@pytest.fixture
def tokens() -> Tensor:
    return torch.randint(0, 17, (2, 5))


def attached(model: Transformer) -> list[str]:
    return [n for n, p in model.hook_points().items() if p.active]


def test_nothing_attached_after_with_block(model: Transformer, tokens: Tensor) -> None:
    calls: list[str] = []
    hooks = [Hook(n, lambda x, c: calls.append(c.name)) for n in model.hook_points()]
    hooks.append(Hook("blocks.1.hook_resid_post", lambda g, c: None, direction="bwd"))
    with model.hooks(hooks):
        assert len(attached(model)) == len(model.hook_points())
        model(tokens)
    assert attached(model) == []
    n = len(calls)
    model(tokens)
    assert len(calls) == n  # no hook ran after the block


def test_nothing_attached_when_body_raises(model: Transformer) -> None:
    with pytest.raises(RuntimeError, match="boom"):
        with model.hooks(("blocks.0.attn.hook_pattern", lambda x, c: None),
                         Hook("hook_embed", lambda g, c: None, direction="bwd")):
            assert sorted(attached(model)) == ["blocks.0.attn.hook_pattern", "hook_embed"]
            raise RuntimeError("boom")
    assert attached(model) == []
    assert model.blocks[0].attn.explicit_heads() == ()


def test_nothing_attached_when_a_later_name_is_unknown(model: Transformer) -> None:
    with pytest.raises(KeyError, match="blocks.0.attn.hook_pattern"):
        with model.hooks(("hook_embed", lambda x, c: None),
                         ("blocks.0.attn.hook_patern", lambda x, c: None)):
            pass  # pragma: no cover
    assert attached(model) == []


def test_nothing_attached_when_forward_raises_inside_run_with_cache(model: Transformer) -> None:
    with pytest.raises(ValueError, match="tokens"):
        model.run_with_cache(torch.full((1, 3), 99), ["blocks.0.attn.hook_pattern"])
    assert attached(model) == []


def test_unknown_name_gives_key_error_with_suggestions(model: Transformer,
                                                       tokens: Tensor) -> None:
    with pytest.raises(KeyError) as err:
        model.run_with_cache(tokens, ["blocks.1.attn.hook_zz"])
    assert "'blocks.1.attn.hook_zz'" in str(err.value)
    assert "blocks.1.attn.hook_z" in str(err.value)
    with pytest.raises(KeyError, match="hook_resid_post"):
        with model.hooks(("blocks.1.resid_post", lambda x, c: None)):
            pass  # pragma: no cover


def test_cache_holds_exactly_the_requested_names(model: Transformer, tokens: Tensor) -> None:
    names = ["blocks.1.attn.hook_pattern", "hook_embed", "blocks.0.mlp.hook_post"]
    logits, cache = model.run_with_cache(tokens, names)
    assert sorted(cache.keys()) == sorted(names)
    assert len(cache) == 3 and "blocks.0.attn.hook_pattern" not in cache
    torch.testing.assert_close(logits, model(tokens), atol=1e-5, rtol=0)
    _, by_pred = model.run_with_cache(tokens, lambda n: n.endswith("hook_z"))
    assert sorted(by_pred.keys()) == ["blocks.0.attn.hook_z", "blocks.1.attn.hook_z"]
    with pytest.raises(KeyError, match="was not cached"):
        cache["blocks.0.attn.hook_z"]


def test_cached_values_are_the_forward_values(model: Transformer, tokens: Tensor) -> None:
    _, cache = model.run_with_cache(tokens, ["blocks.1.hook_resid_pre",
                                             "blocks.0.hook_resid_post", "hook_logits"])
    assert torch.equal(cache["blocks.1.hook_resid_pre"], cache["blocks.0.hook_resid_post"])
    torch.testing.assert_close(cache["hook_logits"], model(tokens), atol=1e-5, rtol=0)
    assert not cache["hook_logits"].requires_grad
    _, kept = model.run_with_cache(tokens, ["hook_logits"], detach=False)
    assert kept["hook_logits"].requires_grad


def test_pattern_is_softmax_of_scaled_qk(model: Transformer, tokens: Tensor) -> None:
    names = ["blocks.1.attn.hook_q", "blocks.1.attn.hook_k", "blocks.1.attn.hook_attn_scores",
             "blocks.1.attn.hook_pattern"]
    _, cache = model.run_with_cache(tokens, names)
    q, k = cache["blocks.1.attn.hook_q"], cache["blocks.1.attn.hook_k"]  # (B, T, H, Dh)
    scores = torch.einsum("bqhd,bkhd->bhqk", q, k) / 2.0  # sqrt(Dh=4)
    future = torch.triu(torch.ones(5, 5, dtype=torch.bool), 1)
    scores = scores.masked_fill(future, float("-inf"))
    torch.testing.assert_close(cache["blocks.1.attn.hook_attn_scores"], scores)
    torch.testing.assert_close(cache["blocks.1.attn.hook_pattern"], scores.softmax(-1))


def test_head_restricted_cache(model: Transformer, tokens: Tensor) -> None:
    explicit: list[tuple[int, ...]] = []
    probe = Hook("blocks.1.attn.hook_z",
                 lambda z, c: explicit.append(model.blocks[1].attn.explicit_heads()))
    _, full = model.run_with_cache(tokens, ["blocks.1.attn.hook_pattern", "blocks.1.attn.hook_z"])
    with model.hooks(probe):
        logits, cache = model.run_with_cache(
            tokens, ["blocks.0.attn.hook_pattern", "blocks.1.attn.hook_pattern",
                     "blocks.1.attn.hook_z", "hook_embed"], heads="L1.H2")
    assert explicit == [(2,)]  # heads 0 and 1 stayed fused
    assert sorted(cache.keys()) == ["blocks.1.attn.hook_pattern", "blocks.1.attn.hook_z",
                                    "hook_embed"]  # layer 0 has no requested head
    pattern = cache["blocks.1.attn.hook_pattern"]
    assert pattern.shape == (2, 1, 5, 5) and cache.heads_of("blocks.1.attn.hook_pattern") == (2,)
    torch.testing.assert_close(pattern[:, 0], full["blocks.1.attn.hook_pattern"][:, 2])
    torch.testing.assert_close(cache.head("blocks.1.attn.hook_pattern", 2), pattern[:, 0])
    assert cache["blocks.1.attn.hook_z"].shape == (2, 5, 1, 4)
    assert torch.equal(cache.head("blocks.1.attn.hook_z", 2), full["blocks.1.attn.hook_z"][:, :, 2])
    assert cache.heads_of("hook_embed") is None
    with pytest.raises(KeyError, match="head 0 not cached"):
        cache.head("blocks.1.attn.hook_pattern", 0)
    torch.testing.assert_close(logits, model(tokens), atol=1e-5, rtol=0)


def test_gqa_restricted_hooks_act_on_the_kv_head() -> None:
    model = build_model(preset("tiny-gqa-rope"), seed=0)  # H=4, Hkv=2: heads 2,3 read kv 1
    tokens = torch.randint(0, 19, (2, 5))
    seen: list[HookContext] = []
    _, full = model.run_with_cache(tokens, ["blocks.0.attn.hook_k", "blocks.0.attn.hook_z"])

    def zero_k(k: Tensor, ctx: HookContext) -> Tensor:
        seen.append(ctx)
        assert k.shape == (2, 5, 1, 6)
        return torch.zeros_like(k)

    with model.hooks(Hook("blocks.0.attn.hook_k", zero_k, heads=(3,))):
        _, cache = model.run_with_cache(tokens, ["blocks.0.attn.hook_k", "blocks.0.attn.hook_z"])
    assert seen[0].heads == (1,)
    k = cache["blocks.0.attn.hook_k"]
    assert torch.equal(k[:, :, 0], full["blocks.0.attn.hook_k"][:, :, 0])
    assert torch.equal(k[:, :, 1], torch.zeros_like(k[:, :, 1]))
    z, z0 = cache["blocks.0.attn.hook_z"], full["blocks.0.attn.hook_z"]
    assert torch.equal(z[:, :, :2], z0[:, :, :2])  # kv head 0's readers unchanged
    assert not torch.allclose(z[:, :, 2:], z0[:, :, 2:])  # both readers of kv head 1 changed


def test_hook_can_edit_in_place(model: Transformer, tokens: Tensor) -> None:
    def double(x: Tensor, ctx: HookContext) -> None:
        x.mul_(2.0)

    _, base = model.run_with_cache(tokens, ["blocks.0.attn.hook_v"])
    with model.hooks(Hook("blocks.0.attn.hook_v", double, heads=(1,))):
        _, cache = model.run_with_cache(tokens, ["blocks.0.attn.hook_v"])
    v, v0 = cache["blocks.0.attn.hook_v"], base["blocks.0.attn.hook_v"]
    torch.testing.assert_close(v[:, :, 1], 2 * v0[:, :, 1])
    assert torch.equal(v[:, :, [0, 2]], v0[:, :, [0, 2]])


@pytest.mark.parametrize("heads", [None, (1,)])
def test_wrong_shape_from_hook_is_a_clear_error(model: Transformer, tokens: Tensor,
                                                heads: tuple[int, ...] | None) -> None:
    with model.hooks(Hook("blocks.0.attn.hook_z", lambda z, c: z[..., :2], heads)):
        with pytest.raises(ValueError) as err:
            model(tokens)
    msg = str(err.value)
    assert "blocks.0.attn.hook_z" in msg
    expected = (2, 5, 3, 4) if heads is None else (2, 5, 1, 4)
    assert str(expected) in msg and "(2, 5, " in msg
    with model.hooks(Hook("hook_embed", lambda x, c: 3.0)):  # type: ignore[arg-type,return-value]
        with pytest.raises(ValueError, match="returned float"):
            model(tokens)
    assert attached(model) == []


@pytest.mark.parametrize("name", ["blocks.1.hook_resid_mid", "blocks.0.attn.hook_v",
                                  "blocks.1.attn.hook_pattern", "hook_embed"])
def test_backward_hook_sees_the_gradient(model: Transformer, tokens: Tensor, name: str) -> None:
    grads: list[Tensor] = []
    bwd = Hook(name, lambda g, c: grads.append(g.clone()), direction="bwd")
    target = torch.randn(2, 5, 17)
    with model.hooks(bwd):
        logits, cache = model.run_with_cache(tokens, [name], detach=False)
        (expected,) = torch.autograd.grad((logits * target).sum(), cache[name])
    assert len(grads) == 1  # fired once, during that backward pass
    torch.testing.assert_close(grads[0], expected)
    assert attached(model) == []


def test_head_restricted_backward_hook(model: Transformer, tokens: Tensor) -> None:
    grads: list[Tensor] = []
    with model.hooks(Hook("blocks.0.attn.hook_z", lambda g, c: grads.append(g), (2,), "bwd")):
        logits, cache = model.run_with_cache(tokens, ["blocks.0.attn.hook_z"], detach=False)
        (expected,) = torch.autograd.grad(logits.square().sum(), cache["blocks.0.attn.hook_z"])
    assert len(grads) == 1 and grads[0].shape == (2, 5, 1, 4)
    torch.testing.assert_close(grads[0][:, :, 0], expected[:, :, 2])


def test_backward_hook_can_replace_the_gradient(model: Transformer, tokens: Tensor) -> None:
    """A bwd hook returning zeros at hook_embed stops the gradient into the embedding."""
    with model.hooks(Hook("hook_embed", lambda g, c: torch.zeros_like(g), direction="bwd")):
        model(tokens).square().sum().backward()
    assert model.embed.weight.grad is not None
    assert torch.equal(model.embed.weight.grad, torch.zeros_like(model.embed.weight))
    assert model.blocks[0].attn.q_proj.weight.grad.abs().sum() > 0


def test_predicate_hook_attaches_to_every_matching_point(model: Transformer,
                                                         tokens: Tensor) -> None:
    names: list[str] = []
    with model.hooks(Hook(lambda n: n.endswith("hook_resid_post"),
                          lambda x, c: names.append(c.name))):
        model(tokens)
    assert names == ["blocks.0.hook_resid_post", "blocks.1.hook_resid_post"]
    assert attached(model) == []
