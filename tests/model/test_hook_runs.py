"""``run_with_hooks``, ``add_hook`` and ``reset_hooks`` with TransformerLens's semantics.

References: a forward with the same edit made by ``with model.hooks(...)``, an edit written by
hand into the residual stream, and the gradient at a point from ``torch.autograd.grad``.
"""

from __future__ import annotations

import pytest
import torch
from torch import Tensor

from headwise.config import preset
from headwise.model import Transformer, build_model

RESID = "blocks.0.hook_resid_post"


@pytest.fixture
def model() -> Transformer:
    return build_model(preset("tiny"), seed=0).eval()  # L=2, H=3, D=12, V=17


@pytest.fixture
def tokens() -> Tensor:
    return torch.randint(0, 17, (2, 5), generator=torch.Generator().manual_seed(3))


def _double(x: Tensor, hook) -> Tensor:
    return x * 2


def test_run_with_hooks_applies_the_hook_for_one_call(model: Transformer, tokens: Tensor) -> None:
    with model.hooks((RESID, _double)):
        want = model(tokens)
    plain = model(tokens)
    got = model.run_with_hooks(tokens, fwd_hooks=[(RESID, _double)])
    assert torch.equal(got, want) and not torch.allclose(got, plain)
    assert torch.equal(model(tokens), plain)  # detached afterwards
    names: list[str] = []
    model.run_with_hooks(tokens, fwd_hooks=[(lambda n: n.endswith("hook_resid_pre"),
                                             lambda x, hook: names.append(hook.name))])
    assert names == ["blocks.0.hook_resid_pre", "blocks.1.hook_resid_pre"]


def test_a_hook_edit_equals_the_edit_written_by_hand(model: Transformer, tokens: Tensor) -> None:
    """Zeroing layer 1's attention output by a hook = resid_mid set to resid_pre by hand."""
    out = model.run_with_hooks(tokens, fwd_hooks=[("blocks.1.hook_attn_out",
                                                   lambda x, hook: torch.zeros_like(x))],
                               return_type="logits")
    _, cache = model.run_with_cache(tokens, ["blocks.1.hook_resid_pre"])
    x = cache["blocks.1.hook_resid_pre"]
    block = model.blocks[1]
    with torch.no_grad():
        x = x + block.mlp(block.ln2(x))
        want = model.unembed(model.ln_final(x))
    torch.testing.assert_close(out, want, atol=1e-6, rtol=0)


def test_backward_hooks_see_the_gradient_at_the_point(model: Transformer,
                                                      tokens: Tensor) -> None:
    grads: list[Tensor] = []
    loss = model.run_with_hooks(tokens, bwd_hooks=[(RESID, lambda g, hook: grads.append(g))],
                                return_type="loss")
    loss.backward()  # after the call: the hook was registered on the forward's tensor
    loss2, cache = model.run_with_cache(tokens, [RESID], detach=False, return_type="loss")
    (want,) = torch.autograd.grad(loss2, cache[RESID])
    assert len(grads) == 1
    torch.testing.assert_close(grads[0], want)


def test_add_hook_stays_until_reset(model: Transformer, tokens: Tensor) -> None:
    plain = model(tokens)
    model.add_hook(RESID, _double)
    model.add_hook("blocks.1.hook_resid_post", _double, is_permanent=True)
    both = model(tokens)
    assert torch.equal(model(tokens), both) and not torch.allclose(both, plain)
    model.reset_hooks()  # the permanent one stays
    permanent_only = model(tokens)
    model.reset_hooks(including_permanent=True)
    assert torch.equal(model(tokens), plain)
    with model.hooks(("blocks.1.hook_resid_post", _double)):
        assert torch.equal(model(tokens), permanent_only)
    model.run_with_hooks(tokens, fwd_hooks=[(RESID, _double)], reset_hooks_end=False)
    assert torch.equal(model(tokens), model.run_with_hooks(tokens, fwd_hooks=[]))
    assert not torch.allclose(model(tokens), plain)
    model.reset_hooks(direction="bwd")  # a forward hook is not a backward one
    assert not torch.allclose(model(tokens), plain)
    model.reset_hooks(direction="fwd")
    assert torch.equal(model(tokens), plain)


@pytest.mark.parametrize("call, message", [
    (lambda m: m.add_hook(RESID, _double, dir="forward"), "dir: got 'forward'"),
    (lambda m: m.reset_hooks(direction="all"), "direction: got 'all'"),
])
def test_bad_directions_are_named(model: Transformer, call, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        call(model)


def test_an_unknown_name_is_refused_with_close_matches(model: Transformer,
                                                       tokens: Tensor) -> None:
    with pytest.raises(KeyError, match="blocks.0.hook_resid_post"):
        model.run_with_hooks(tokens, fwd_hooks=[("blocks.0.hook_resid_pots", _double)])
