"""Per-head freezing: frozen slices stay bitwise equal through AdamW with weight decay."""

from __future__ import annotations

import pytest
import torch

from headwise import SelectorError
from headwise.control import freeze

from .conftest import make

D, DH = 20, 6


def train(model, steps: int = 5, attach=None):  # type: ignore[no-untyped-def]
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.5)
    if attach is not None:
        attach.attach(opt)
    for _ in range(steps):
        tokens = torch.randint(0, 23, (4, 9))
        loss = torch.nn.functional.cross_entropy(model(tokens)[:, :-1].reshape(-1, 23),
                                                 tokens[:, 1:].reshape(-1))
        opt.zero_grad()
        loss.backward()
        opt.step()


def trainable_slices(layer: int, q: list[int], kv: list[int]) -> dict[str, list]:
    """Independent statement of which slices a head owns (architecture doc)."""
    rows = lambda hs: [slice(h * DH, (h + 1) * DH) for h in hs]  # noqa: E731
    a = f"blocks.{layer}.attn"
    return {f"{a}.q_proj.weight": rows(q), f"{a}.q_proj.bias": rows(q),
            f"{a}.k_proj.weight": rows(kv), f"{a}.k_proj.bias": rows(kv),
            f"{a}.v_proj.weight": rows(kv), f"{a}.v_proj.bias": rows(kv),
            f"{a}.o_proj.weight": [(slice(None), s) for s in rows(q)]}


@pytest.mark.parametrize("kv_heads, kv_expected", [(4, [2]), (2, [1])])
def test_frozen_slices_bitwise_equal_after_adamw_with_decay(kv_heads: int,
                                                           kv_expected: list[int]) -> None:
    model = make(n_kv_heads=kv_heads)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    handle = freeze(model, "L1.H2")
    train(model, attach=handle)
    owned = trainable_slices(1, [2], kv_expected)
    for name, p in model.named_parameters():
        keep = torch.ones_like(p, dtype=torch.bool)
        for sl in owned.get(name, []):
            keep[sl] = False
            assert not torch.equal(p[sl], before[name][sl]), f"{name}{sl} did not train"
        assert torch.equal(p[keep], before[name][keep]), f"{name} moved outside its head"
    expected_count = DH * D + DH + 2 * (DH * D + DH) + D * DH
    assert handle.trainable_count() == expected_count


def test_gradient_masking_alone_lets_weight_decay_move_frozen_slices() -> None:
    model = make()
    before = model.blocks[1].attn.q_proj.weight.detach().clone()
    freeze(model, "L1.H2")  # not attached to the optimizer: only gradients are masked
    train(model)
    after = model.blocks[1].attn.q_proj.weight
    assert not torch.equal(after[:DH], before[:DH])  # head 0's rows decayed


def test_module_patterns_and_layers() -> None:
    model = make()
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    handle = freeze(model, ["blocks.0.mlp", "unembed.weight"])
    train(model, attach=handle)
    for name, p in model.named_parameters():
        moved = not torch.equal(p, before[name])
        assert moved == (name.startswith("blocks.0.mlp.") or name == "unembed.weight"), name
    n = sum(p.numel() for n, p in model.named_parameters()
            if n.startswith("blocks.0.mlp.") or n == "unembed.weight")
    assert handle.trainable_count() == n
    handle.remove()
    assert all(p.requires_grad for p in model.parameters())


def test_bad_freeze_input_raises_naming_it() -> None:
    model = make()
    with pytest.raises(SelectorError, match="L1.H4"):
        freeze(model, "L1.H4")
    with pytest.raises(ValueError, match="pattern 'blocks.7.\\*' matches no parameter"):
        freeze(model, "blocks.7.*")
    with pytest.raises(ValueError, match="trainable: got 3"):
        freeze(model, [3])
    # Not in the selector grammar (headwise.heads): read as a parameter-name pattern.
    with pytest.raises(ValueError, match=r"^trainable: pattern 'L1-\.H2' matches no parameter"):
        freeze(model, "L1-.H2")
