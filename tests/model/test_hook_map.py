"""The name -> HookPoint map a Transformer owns: built at construction, refreshed by the code
that changes the module tree (adapters, gates, the masked-LM head) and by ``model.setup()``.

Reference: a fresh walk of ``named_modules()`` (what the map must equal after every change), and
hooks that must fire on the module that is in the model now.
"""

from __future__ import annotations

import copy
from typing import Any

import pytest
import torch
from torch import Tensor, nn

from headwise.config import preset
from headwise.hooks import Hook
from headwise.model import Transformer, build_model
from headwise.model.hook_point import HookPoint, hook_points


def walked(model: nn.Module) -> dict[str, HookPoint]:
    """The map by an independent walk: every HookPoint under its module path."""
    return {n: m for n, m in model.named_modules() if isinstance(m, HookPoint)}


@pytest.fixture
def model() -> Transformer:
    return build_model(preset("tiny"), seed=0)  # L=2, H=3, Dh=4, D=12, V=17


def _fires(model: Transformer, name: str) -> list[Any]:
    seen: list[Any] = []
    with model.hooks(Hook(name, lambda x, ctx: seen.append(ctx.name))):
        with torch.no_grad():
            model(torch.randint(0, 17, (2, 5)))
    return seen


def test_map_is_built_at_construction_and_reused(model: Transformer) -> None:
    assert model.hook_dict == walked(model)
    assert all(p.name == n for n, p in model.hook_dict.items())
    assert hook_points(model) is model.hook_dict  # no walk on a lookup
    assert model.hook_points() == model.hook_dict and model.hook_points() is not model.hook_dict


def test_setup_maps_a_module_put_in_by_hand_under_its_new_path(model: Transformer) -> None:
    other = build_model(preset("tiny"), seed=1)
    old_point = model.blocks[1].attn.hook_pattern
    model.blocks[1].attn = other.blocks[0].attn  # named blocks.0.* in ``other``
    assert model.hook_dict["blocks.1.attn.hook_pattern"] is old_point  # not yet: as in TL
    model.setup()
    assert model.hook_dict == walked(model)
    assert model.hook_dict["blocks.1.attn.hook_pattern"] is other.blocks[0].attn.hook_pattern
    assert old_point not in model.hook_dict.values()
    assert _fires(model, "blocks.1.attn.hook_pattern") == ["blocks.1.attn.hook_pattern"]


def test_setup_sees_an_appended_block_and_a_cleared_module(model: Transformer) -> None:
    other = build_model(preset("tiny"), seed=1)
    model.blocks.append(other.blocks[1])
    model.ln_final = None
    model.setup()
    assert model.hook_dict == walked(model)
    assert "blocks.2.attn.hook_pattern" in model.hook_dict
    assert "ln_final.hook_normalized" not in model.hook_dict


def test_adapters_applied_and_removed_refresh_the_map(model: Transformer) -> None:
    """``apply_lora`` / ``remove_lora`` change the tree and map it again; hooks and caches
    read the adapted model (the reference: q computed from the adapter's effective weight)."""
    from headwise.control import apply_lora, lora_modules, remove_lora

    before = model.hook_dict
    apply_lora(model, targets=("q_proj", "v_proj"), rank=2)
    assert model.hook_dict is not before and model.hook_dict == walked(model)
    for mod in lora_modules(model).values():
        nn.init.normal_(mod.lora_B)  # B starts at zero: make the adapter change q
    tokens = torch.randint(0, 17, (2, 5))
    with torch.no_grad():
        _, cache = model.run_with_cache(tokens, ["blocks.0.ln1.hook_normalized",
                                                 "blocks.0.attn.hook_q"])
        q_proj = model.blocks[0].attn.q_proj
        want = cache["blocks.0.ln1.hook_normalized"] @ q_proj.effective_weight().T \
            + q_proj.base_layer.bias
    torch.testing.assert_close(cache["blocks.0.attn.hook_q"].flatten(2), want)
    adapted = model.hook_dict
    remove_lora(model)
    assert model.hook_dict is not adapted and model.hook_dict == walked(model)


def test_gates_installed_and_removed_are_seen_by_run_with_cache(model: Transformer) -> None:
    """``run_with_cache`` checks task ids against the installed gates' task count, read once
    per module tree: a 2-task gate installed after construction refuses task id 2, and its
    removal lifts the refusal."""
    from headwise.control import FixedGates

    tokens, task_ids = torch.randint(0, 17, (2, 5)), torch.tensor([0, 2])
    names = ["blocks.1.attn.hook_z"]
    model.run_with_cache(tokens, names, task_ids=task_ids)  # no gate: id 2 is fine
    gates = FixedGates(model, {0: "L1.H0", 1: "L1.H1"})
    assert model.hook_dict == walked(model)
    with pytest.raises(ValueError, match=r"task_ids: got range \[0, 2\], expected ids in \[0, 2\)"):
        model.run_with_cache(tokens, names, task_ids=task_ids)
    _, cache = model.run_with_cache(tokens, names, task_ids=torch.tensor([0, 1]))
    gates.remove()
    model.run_with_cache(tokens, names, task_ids=task_ids)


def test_an_mlm_head_added_later_has_its_hook_point(model: Transformer) -> None:
    from headwise.data.mlm import MLMTask, add_mlm_head

    encoder = build_model(preset("tiny-encoder"), seed=0)
    assert "mlm_head.norm.hook_normalized" not in encoder.hook_dict
    add_mlm_head(encoder, [MLMTask], seed=0)
    assert encoder.hook_dict == walked(encoder)
    tokens = torch.randint(0, encoder.config.vocab_size, (2, 5))
    _, cache = encoder.run_with_cache(tokens, ["mlm_head.norm.hook_normalized"])
    assert cache["mlm_head.norm.hook_normalized"].shape == (2, 5, encoder.config.d_model)


def test_a_copy_maps_its_own_points(model: Transformer) -> None:
    twin = copy.deepcopy(model)
    assert twin.hook_dict == walked(twin)
    assert not set(map(id, twin.hook_dict.values())) & set(map(id, model.hook_dict.values()))


def test_a_wrapper_reads_the_models_map(model: Transformer) -> None:
    """Like ``torch.compile``'s OptimizedModule: the model under ``_orig_mod``, attribute
    lookups forwarded to it; a module that keeps no map is walked, names kept."""

    class Wrapper(nn.Module):
        def __init__(self, inner: nn.Module) -> None:
            super().__init__()
            self._orig_mod = inner

        def __getattr__(self, name: str) -> Any:
            if name == "_orig_mod":
                return self._modules["_orig_mod"]
            return getattr(self._orig_mod, name)

        def forward(self, tokens: Tensor) -> Tensor:
            return self._orig_mod(tokens)

    assert hook_points(Wrapper(model)) is model.hook_dict
    plain = nn.Sequential(model)  # forwards nothing: walked, the model's names kept
    assert hook_points(plain) == walked(model)


def test_training_steps_do_not_walk_the_module_tree(model: Transformer,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """The loop attaches its objectives' hooks at every step; with the map built once, no step
    walks the tree again (counted on ``named_modules`` of the model)."""
    from headwise.control.objectives import PatternObjective
    from headwise.data import CopyTask, Mixture
    from headwise.training import TrainConfig, train

    objective = PatternObjective(model, "L1.H0", "previous_token")
    walks: list[int] = []
    real = nn.Module.named_modules

    def counted(self: nn.Module, *args: Any, **kwargs: Any) -> Any:
        if self is model:
            walks.append(1)
        return real(self, *args, **kwargs)

    data = Mixture({"copy": CopyTask(length=4, vocab_size=17)})

    def run(steps: int) -> int:
        walks.clear()
        train(model, data, TrainConfig(steps=steps, batch_size=4, eval_every=100),
              objectives=[objective], progress=False)
        return len(walks)

    run(1)  # warm: builds whatever the loop builds once
    monkeypatch.setattr(nn.Module, "named_modules", counted)
    assert run(6) == run(2)  # walks do not grow with the number of steps


def test_run_with_cache_walks_no_tree(model: Transformer,
                                      monkeypatch: pytest.MonkeyPatch) -> None:
    tokens = torch.randint(0, 17, (2, 5))
    model.run_with_cache(tokens, ["blocks.0.attn.hook_pattern"], task_ids=torch.tensor([0, 1]))
    walks: list[int] = []
    real = nn.Module.named_modules

    def counted(self: nn.Module, *args: Any, **kwargs: Any) -> Any:
        walks.append(1)
        return real(self, *args, **kwargs)

    monkeypatch.setattr(nn.Module, "named_modules", counted)
    for _ in range(3):
        model.run_with_cache(tokens, ["blocks.0.attn.hook_pattern"],
                             task_ids=torch.tensor([0, 1]))
    assert walks == []
