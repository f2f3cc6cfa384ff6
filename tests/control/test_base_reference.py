"""The starting model a run compares with: with adapters, the model before LoRA and no copy of
its weights; without, a frozen copy that training does not reach."""

from __future__ import annotations

import pytest
import torch

from headwise.control import (
    apply_lora,
    base_of,
    capture_base,
    lora_disabled,
    lora_modules,
    merge_lora,
)

from .conftest import make


def _tokens() -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(3)
    tokens = torch.randint(0, 23, (5, 9), generator=g)
    mask = torch.ones(5, 9, dtype=torch.long)
    mask[2, 6:] = 0
    return tokens, mask


def _storages(module: torch.nn.Module) -> set[int]:
    return {p.untyped_storage().data_ptr() for p in module.parameters()}


def test_with_adapters_the_base_is_the_model_before_lora_and_copies_nothing() -> None:
    model = make()
    tokens, mask = _tokens()
    with torch.no_grad():
        before = model(tokens, attention_mask=mask)
        before_hidden = model.hidden(tokens, attention_mask=mask)
    apply_lora(model, targets=("q_proj", "v_proj", "o_proj"), heads="L1.H2,L0.H0", rank=2)
    ref = capture_base(model)
    assert ref.shares_weights and ref.copied_bytes == 0 and base_of(model) is ref
    with torch.no_grad():  # "training": the adapters move away from zero
        for mod in lora_modules(model).values():
            mod.lora_B.normal_(0.0, 0.5)
    model.train()
    trained = model(tokens, attention_mask=mask)
    assert float((trained.detach() - before).abs().max()) > 1e-2
    with ref.model() as base:
        assert base is model and not base.training and not torch.is_grad_enabled()
        assert _storages(base) == _storages(model)  # the very same tensors: no second copy
        out = base(tokens, attention_mask=mask)
        hidden = base.hidden(tokens, attention_mask=mask)
    assert torch.equal(out, before) and torch.equal(hidden, before_hidden)  # bit-identical
    assert model.training and torch.is_grad_enabled()  # every state restored afterwards
    assert not any(m.disabled for m in lora_modules(model).values())
    assert torch.equal(model(tokens, attention_mask=mask), trained)


def test_without_adapters_the_base_is_a_frozen_copy_training_does_not_reach() -> None:
    model = make()
    tokens, mask = _tokens()
    with torch.no_grad():
        before = model(tokens, attention_mask=mask)
    ref = capture_base(model)
    n_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    assert not ref.shares_weights and ref.copied_bytes >= n_bytes
    with ref.model() as base:
        assert base is not model and not _storages(base) & _storages(model)
        assert all(not p.requires_grad for p in base.parameters())
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    for _ in range(3):
        opt.zero_grad()
        model(tokens, attention_mask=mask).logsumexp(-1).mean().backward()
        opt.step()
    with torch.no_grad():
        assert float((model(tokens, attention_mask=mask) - before).abs().max()) > 1e-2
    with ref.model() as base:
        assert torch.equal(base(tokens, attention_mask=mask), before)


def test_adapters_beside_other_trainable_parameters_get_a_copy() -> None:
    """The adapters switched off are the start only when nothing else trains."""
    model = make()
    apply_lora(model, targets=("q_proj",), rank=2)
    model.embed.weight.requires_grad_(True)
    assert not capture_base(model).shares_weights


def test_capture_refusals_and_lora_disabled_restores_state() -> None:
    model = make()
    apply_lora(model, targets=("q_proj",), rank=2)
    mods = list(lora_modules(model).values())
    mods[0].disabled = True  # a state of the user's, kept through the block
    with pytest.raises(RuntimeError), lora_disabled(model):
        assert all(m.disabled for m in mods)
        raise RuntimeError("inside")
    assert [m.disabled for m in mods] == [True] + [False] * (len(mods) - 1)
    capture_base(model)
    with pytest.raises(ValueError, match="already has a base reference"):
        capture_base(model)
    merged = make()
    apply_lora(merged, targets=("q_proj",), rank=2)
    merge_lora(merged)
    with pytest.raises(ValueError, match="merged"):
        capture_base(merged)
    with pytest.raises(ValueError, match="merged"), lora_disabled(merged):
        pass
    assert "base_reference" not in "".join(model.state_dict())


def test_the_frozen_copy_follows_the_model_to_another_device() -> None:
    """Verification runs on the CPU after training on an accelerator: the copy moves along."""
    model = make()
    ref = capture_base(model)
    meta = torch.device("meta")  # a device other than the CPU that every machine has
    model.to(meta)
    with ref.model() as base:
        assert {p.device for p in base.parameters()} == {meta}
