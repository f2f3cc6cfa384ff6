"""LoRA: bitwise no-op when fresh, head scope, merge/unmerge, save/load, PEFT parity, counts."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from headwise import CheckpointError, SelectorError
from headwise.control import (
    LoRALinear,
    apply_lora,
    load_lora,
    lora_modules,
    merge_lora,
    remove_lora,
    save_lora,
    set_lora_disabled,
    unmerge_lora,
)

from .conftest import make

D, H, DH, FF = 20, 4, 6, 28


def randomise(model) -> None:  # type: ignore[no-untyped-def]
    with torch.no_grad():
        for mod in lora_modules(model).values():
            mod.lora_B.normal_()


@pytest.mark.parametrize("kwargs", [
    dict(targets=("q_proj", "v_proj")),
    dict(targets=("q_proj", "k_proj", "v_proj", "o_proj", "up_proj", "down_proj"), layers=1),
    dict(targets=("q_proj", "k_proj", "o_proj"), heads="L0.H1,L1.H0,L1.H3"),
])
def test_fresh_adapter_is_bitwise_noop_and_counts_match_formula(kwargs) -> None:  # type: ignore[no-untyped-def]
    model = make(n_kv_heads=2)
    tokens = torch.randint(0, 23, (2, 9))
    before = model(tokens)
    config = apply_lora(model, rank=3, alpha=6, **kwargs)
    assert torch.equal(model(tokens), before)
    shapes = {"q_proj": (D, H * DH), "k_proj": (D, 2 * DH), "v_proj": (D, 2 * DH),
              "o_proj": (H * DH, D), "up_proj": (D, FF), "down_proj": (FF, D)}
    if "heads" in kwargs:  # L0: q rows 1 head, kv rows 1 kv head, o cols 1 head; L1: 2 heads
        per = {0: {"q_proj": (D, DH), "k_proj": (D, DH), "o_proj": (DH, D)},
               1: {"q_proj": (D, 2 * DH), "k_proj": (D, 2 * DH), "o_proj": (2 * DH, D)}}
        formula = sum(3 * (i + o) for layer in per.values() for i, o in layer.values())
    else:
        n_layers = 2 if "layers" not in kwargs else 1
        formula = n_layers * sum(3 * (i + o) for t, (i, o) in shapes.items()
                                 if t in config.targets)
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    assert trainable == formula
    assert all("lora_" in n for n, p in model.named_parameters() if p.requires_grad)


def test_head_scoped_q_adapter_changes_only_that_heads_hook_q() -> None:
    model = make()
    tokens = torch.randint(0, 23, (3, 9))
    names = ["blocks.0.attn.hook_q", "blocks.1.attn.hook_q"]
    _, before = model.run_with_cache(tokens, names)
    apply_lora(model, targets=("q_proj",), heads="L1.H2", rank=2)
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=0.05)
    for _ in range(5):
        loss = torch.nn.functional.cross_entropy(model(tokens)[:, :-1].reshape(-1, 23),
                                                 tokens[:, 1:].reshape(-1))
        opt.zero_grad()
        loss.backward()
        opt.step()
    _, after = model.run_with_cache(tokens, names)
    assert torch.equal(after[names[0]], before[names[0]])
    q0, q1 = before[names[1]], after[names[1]]  # (B, T, H, Dh)
    assert not torch.equal(q1[:, :, 2], q0[:, :, 2])
    for h in (0, 1, 3):
        assert torch.equal(q1[:, :, h], q0[:, :, h])


def test_merge_unmerge_disable_and_hook_result_see_the_adapter() -> None:
    model = make()
    apply_lora(model, targets=("q_proj", "o_proj", "down_proj"), heads=None, rank=4)
    randomise(model)
    tokens = torch.randint(0, 23, (2, 8))
    out = model(tokens)
    base = make()
    set_lora_disabled(model, True)
    assert torch.equal(model(tokens), base(tokens))
    set_lora_disabled(model, False)
    assert torch.equal(model(tokens), out)
    with model.hooks(("blocks.1.attn.hook_result", lambda x, c: None)):  # effective_weight()
        torch.testing.assert_close(model(tokens), out, rtol=0, atol=1e-5)
    weights = {n: m.base_layer.weight.detach().clone() for n, m in lora_modules(model).items()}
    merge_lora(model)
    torch.testing.assert_close(model(tokens), out, rtol=0, atol=1e-5)
    with pytest.raises(ValueError, match="adapters are merged"):
        set_lora_disabled(model, True)
    unmerge_lora(model)
    for n, m in lora_modules(model).items():
        assert (m.base_layer.weight - weights[n]).abs().max() <= 1e-6
    remove_lora(model)
    assert not lora_modules(model) and all(p.requires_grad for p in model.parameters())
    torch.testing.assert_close(model(tokens), base(tokens), rtol=0, atol=1e-6)


def test_save_then_load_reproduces_outputs_exactly(tmp_path) -> None:  # type: ignore[no-untyped-def]
    model = make(n_kv_heads=2)
    apply_lora(model, targets=("k_proj", "v_proj", "o_proj"), heads="L0.H1,L0.H3", rank=2,
               alpha=5)
    randomise(model)
    tokens = torch.randint(0, 23, (2, 9))
    out = model(tokens)
    save_lora(model, tmp_path / "adapter")
    assert sorted(p.name for p in (tmp_path / "adapter").iterdir()) == [
        "adapter.safetensors", "adapter_config.json"]
    fresh = make(n_kv_heads=2)
    config = load_lora(fresh, tmp_path / "adapter")
    assert config.heads == "L0.H1,L0.H3" and config.rank == 2
    assert torch.equal(fresh(tokens), out)


def test_lora_linear_matches_peft_including_head_scope() -> None:
    peft = pytest.importorskip("peft")

    class Net(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.proj = nn.Linear(10, 12)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.proj(x)

    base = Net()
    ours = LoRALinear(base.proj, rank=3, alpha=7, out_rows=[2, 3, 4, 8, 9])
    with torch.no_grad():
        ours.lora_B.normal_()
    ref = peft.get_peft_model(Net(), peft.LoraConfig(target_modules=["proj"], r=3,
                                                     lora_alpha=7))
    layer = ref.base_model.model.proj
    A, B = ours.full_factors()
    with torch.no_grad():
        layer.base_layer.load_state_dict(base.proj.state_dict())
        layer.lora_A["default"].weight.copy_(A)
        layer.lora_B["default"].weight.copy_(B)
    x = torch.randn(4, 10)
    torch.testing.assert_close(ours(x), ref(x), rtol=0, atol=1e-6)
    assert torch.equal(ours(x)[:, [0, 1, 5, 6, 7, 10, 11]], base.proj(x)[:, [0, 1, 5, 6, 7, 10,
                                                                               11]])
    torch.testing.assert_close(ours.delta_weight(), B @ A * (7 / 3))


def test_bad_lora_input_raises_naming_it(tmp_path) -> None:  # type: ignore[no-untyped-def]
    model = make()
    for rank in (0, -2):
        with pytest.raises(ValueError, match=f"rank: got {rank}, expected an integer >= 1"):
            apply_lora(model, rank=rank)
    with pytest.raises(ValueError, match="targets: got 'qkv'"):
        apply_lora(model, targets=("qkv",))
    with pytest.raises(ValueError, match="\\['up_proj'\\] are FFN modules"):
        apply_lora(model, targets=("up_proj",), heads="L0.H0")
    with pytest.raises(ValueError, match="gate_proj is not an nn.Linear"):
        apply_lora(model, targets=("gate_proj",))
    with pytest.raises(SelectorError, match="L0.H4"):
        apply_lora(model, heads="L0.H4")
    with pytest.raises(ValueError, match="layers: got 5"):
        apply_lora(model, layers=[5])
    with pytest.raises(CheckpointError, match="adapter_config.json"):
        load_lora(model, tmp_path / "missing")
    apply_lora(model, rank=2)
    save_lora(model, tmp_path / "a")
    with pytest.raises(ValueError, match="already has LoRA adapters"):
        apply_lora(model)
    other = make(d_model=24)
    with pytest.raises(CheckpointError, match="has shape"):
        load_lora(other, tmp_path / "a")
    assert not lora_modules(other)
