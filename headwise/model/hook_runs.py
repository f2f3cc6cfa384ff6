"""TransformerLens's hook-running API: ``run_with_hooks``, ``add_hook`` and ``reset_hooks``.

``run_with_hooks(model, tokens, fwd_hooks=[(name, fn)], bwd_hooks=[...])`` runs one forward
with the hooks attached and detaches them when it returns (``model.hooks(...)`` as a call).
``add_hook`` attaches a hook that stays until ``reset_hooks`` removes it (a permanent one only
when asked). Names are full hook names or predicates over them, as in TransformerLens; a hook
function has TransformerLens's signature ``fn(value, hook)`` (``hook.name``).

A backward hook is registered on the forward's tensor, so it runs in a later ``backward()``
even after ``run_with_hooks`` has detached it (TransformerLens removes such hooks first and
needs ``reset_hooks_end=False``; here both work).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from torch import nn

from headwise.model.hook_point import Hook, HookFn, attach_hooks, hook_points, resolve_points

DIRECTIONS = ("fwd", "bwd")
HookName = str | Callable[[str], bool]


def run_with_hooks(model: nn.Module, *model_args: Any,
                   fwd_hooks: Iterable[tuple[Any, ...]] = (),
                   bwd_hooks: Iterable[tuple[Any, ...]] = (), reset_hooks_end: bool = True,
                   **model_kwargs: Any) -> Any:
    """``model(*model_args, **model_kwargs)`` with hooks attached, as TransformerLens's.

    Args:
        fwd_hooks: ``(name or predicate, fn)`` pairs (or ``(name, fn, heads)``: restricted to
            those query heads of the layer) run on values.
        bwd_hooks: the same, run on gradients at the points.
        reset_hooks_end: detach the hooks when the forward returns; ``False`` keeps them
            attached, as ``add_hook`` does, until ``reset_hooks``.

    Returns:
        The model's output.

    Raises:
        KeyError: a name that is no hook point of the model.
        TypeError: an entry that is not a ``(name, fn)`` pair.
    """
    hooks = [_hook(entry, "fwd") for entry in fwd_hooks] + [
        _hook(entry, "bwd") for entry in bwd_hooks]
    if not reset_hooks_end:
        for hook in hooks:
            _add(model, hook, is_permanent=False)
        return model(*model_args, **model_kwargs)
    with attach_hooks(model, hooks):
        return model(*model_args, **model_kwargs)


def add_hook(model: nn.Module, name: HookName, hook: HookFn, dir: str = "fwd",
             is_permanent: bool = False) -> None:
    """Attach ``hook`` at ``name`` (or every point a predicate selects) until ``reset_hooks``.

    Raises:
        KeyError: a name that is no hook point of the model.
        ValueError: ``dir`` other than ``"fwd"`` or ``"bwd"``.
    """
    if dir not in DIRECTIONS:
        raise ValueError(f"dir: got {dir!r}, expected 'fwd' or 'bwd'")
    _add(model, Hook(name, hook, direction=dir), is_permanent)


def reset_hooks(model: nn.Module, direction: str = "both",
                including_permanent: bool = False) -> None:
    """Remove the hooks ``add_hook`` (or ``run_with_hooks(..., reset_hooks_end=False)``)
    attached: those of ``direction`` (``"fwd"``, ``"bwd"`` or ``"both"``), permanent ones only
    with ``including_permanent``. Hooks attached by a ``with model.hooks(...)`` block are
    that block's to remove.

    Raises:
        ValueError: another ``direction``.
    """
    if direction not in (*DIRECTIONS, "both"):
        raise ValueError(f"direction: got {direction!r}, expected 'fwd', 'bwd' or 'both'")
    for point in hook_points(model).values():
        kept = []
        for hook, permanent in point.added:
            if (permanent and not including_permanent) or direction not in ("both",
                                                                             hook.direction):
                kept.append((hook, permanent))
            else:
                point.detach(hook)
        point.added = kept


def _add(model: nn.Module, hook: Hook, is_permanent: bool) -> None:
    for point in resolve_points(hook_points(model), hook.name):
        point.attach(hook)
        point.added.append((hook, is_permanent))


def _hook(entry: Any, direction: str) -> Hook:
    if not isinstance(entry, tuple) or not 2 <= len(entry) <= 3:
        raise TypeError(f"{direction}_hooks: expected (name, fn) pairs, got {entry!r}")
    heads = tuple(entry[2]) if len(entry) == 3 and entry[2] is not None else None
    return Hook(entry[0], entry[1], heads, direction=direction)
