"""The name -> HookPoint map: built once per model, rebuilt after a module change, never stale.

Reference: a fresh walk of ``named_modules()`` (what the map must equal at every moment), and
hooks that must fire on the module that is in the model now.
"""

from __future__ import annotations

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


def test_map_equals_a_walk_and_is_reused(model: Transformer) -> None:
    first = hook_points(model)
    assert first == walked(model)
    assert all(p.name == n for n, p in first.items())
    assert hook_points(model) is first  # no second walk
    assert model.hook_points() == first and model.hook_points() is not first  # a copy


def _fires(model: Transformer, name: str) -> list[Any]:
    seen: list[Any] = []
    with model.hooks(Hook(name, lambda x, ctx: seen.append(ctx.name))):
        with torch.no_grad():
            model(torch.randint(0, 17, (2, 5)))
    return seen


def test_replaced_attention_is_mapped_and_named_by_its_new_path(model: Transformer) -> None:
    other = build_model(preset("tiny"), seed=1)
    old_point = model.blocks[1].attn.hook_pattern
    stale = hook_points(model)
    model.blocks[1].attn = other.blocks[0].attn  # named blocks.0.* in ``other``
    fresh = hook_points(model)
    assert fresh is not stale and fresh == walked(model)
    assert fresh["blocks.1.attn.hook_pattern"] is other.blocks[0].attn.hook_pattern
    assert old_point not in fresh.values()
    assert _fires(model, "blocks.1.attn.hook_pattern") == ["blocks.1.attn.hook_pattern"]


def test_adapter_wrapping_a_linear_rebuilds_the_map(model: Transformer) -> None:
    from headwise.control import apply_lora

    stale = hook_points(model)
    apply_lora(model, targets=("q_proj", "v_proj"), rank=2)
    fresh = hook_points(model)
    assert fresh is not stale and fresh == walked(model)
    assert _fires(model, "blocks.0.attn.hook_q") == ["blocks.0.attn.hook_q"]


def test_appended_block_and_cleared_module_are_seen(model: Transformer) -> None:
    other = build_model(preset("tiny"), seed=1)
    model.blocks.append(other.blocks[1])
    assert hook_points(model) == walked(model)
    assert "blocks.2.attn.hook_pattern" in hook_points(model)
    model.ln_final = None
    assert hook_points(model) == walked(model)
    assert "ln_final.hook_normalized" not in hook_points(model)


def test_a_wrapper_keeps_the_models_names(model: Transformer) -> None:
    """Like ``torch.compile``'s OptimizedModule: the model under ``_orig_mod``, attribute
    lookups forwarded to it."""

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

    wrapper = Wrapper(model)
    assert wrapper.names_hook_points  # forwarded, as OptimizedModule does
    assert hook_points(wrapper) == walked(model)  # names of the model, not "_orig_mod.*"
    assert hook_points(model) == walked(model)


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


def test_run_with_cache_walks_no_tree_and_sees_a_gate_set_later(
        model: Transformer, monkeypatch: pytest.MonkeyPatch) -> None:
    """``run_with_cache`` checks task ids against the installed gates' task count; that count is
    found once per module tree, not by a walk at every call, and follows a gate set or cleared
    (the reference: task id 2 is refused exactly while a 2-task gate is installed)."""

    class PassGate(nn.Module):
        n_tasks = 2

        def forward(self, z: Tensor, task_ids: Tensor | None) -> Tensor:
            return z

    tokens, task_ids = torch.randint(0, 17, (2, 5)), torch.tensor([0, 2])
    names = ["blocks.0.attn.hook_pattern"]
    model.run_with_cache(tokens, names, task_ids=task_ids)  # no gate: id 2 is fine
    walks: list[int] = []
    real = nn.Module.named_modules

    def counted(self: nn.Module, *args: Any, **kwargs: Any) -> Any:
        walks.append(1)
        return real(self, *args, **kwargs)

    monkeypatch.setattr(nn.Module, "named_modules", counted)
    for _ in range(3):
        model.run_with_cache(tokens, names, task_ids=task_ids)
    assert walks == []
    model.blocks[1].attn.head_gate = PassGate()
    with pytest.raises(ValueError, match=r"task_ids: got range \[0, 2\], expected ids in \[0, 2\)"):
        model.run_with_cache(tokens, names, task_ids=task_ids)
    model.blocks[1].attn.head_gate = None
    model.run_with_cache(tokens, names, task_ids=task_ids)
