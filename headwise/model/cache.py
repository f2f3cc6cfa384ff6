"""``run_with_cache`` and its ActivationCache: run the model, keep only the named hook points."""

from __future__ import annotations

import operator
from collections.abc import Callable, Iterable
from typing import Any

from torch import Tensor, nn

from headwise.errors import SelectorError
from headwise.heads import select_heads
from headwise.model.hook_point import Hook, HookContext, attach_hooks, hook_points, resolve_points
from headwise.model.inputs import check_tokens, gate_tasks


class ActivationCache:
    """Cached activations by hook name; head-restricted entries record which heads they hold.

    ``cache[name]`` is the tensor. For points with a head axis, ``cache.heads_of(name)`` gives
    the head indices along it (``None``: all heads; kv heads on GQA ``hook_k``/``hook_v``) and
    ``cache.head(name, h)`` query head ``h``'s slice (its kv group's on those points).
    """

    def __init__(self) -> None:
        self._store: dict[str, Tensor] = {}
        self._heads: dict[str, tuple[int, ...] | None] = {}
        self._axis: dict[str, int | None] = {}
        self._kv_group: dict[str, int] = {}  # query heads per stored head (GQA k/v points)

    def __getitem__(self, name: str) -> Tensor:
        if name not in self._store:
            raise KeyError(f"{name!r} was not cached; cached: {sorted(self._store)}")
        return self._store[name]

    def __contains__(self, name: object) -> bool:
        return name in self._store

    def __len__(self) -> int:
        return len(self._store)

    def keys(self) -> list[str]:
        return list(self._store)

    def items(self) -> list[tuple[str, Tensor]]:
        return list(self._store.items())

    def heads_of(self, name: str) -> tuple[int, ...] | None:
        """Head indices held along the head axis of ``name`` (``None``: every head)."""
        self[name]
        return self._heads[name]

    def axis_of(self, name: str) -> int | None:
        """The head axis of ``name``'s value (``None``: not head-shaped)."""
        self[name]
        return self._axis[name]

    def head(self, name: str, head: int) -> Tensor:
        """One query head's slice of a cached value (the head axis removed).

        ``head`` is a query-head number on every point. Under grouped-query attention
        ``hook_k``/``hook_v`` (and ``hook_rot_k``) hold kv heads: query head ``h`` gets the slice
        of kv head ``h // (H / H_kv)``, the one it reads (``headwise.kv_head``).

        Raises:
            SelectorError: ``head`` is not a head of this point (names the head and the shape).
            KeyError: no head axis at ``name``, or the head was not cached there.
        """
        value, axis, heads = self[name], self._axis[name], self._heads[name]
        if axis is None:
            raise KeyError(f"{name!r} has no head axis")
        group = self._kv_group[name]
        try:
            h: int | None = operator.index(head)
        except TypeError:
            h = None
        if heads is None:  # every head is held: the shape says which numbers exist
            n = value.shape[axis] * group
            if h is None or not 0 <= h < n:
                kv = f" ({value.shape[axis]} kv heads of {group} query heads each)" * (group > 1)
                raise SelectorError(f"{name}: head {head!r} out of range; expected a query head "
                                    f"0-{n - 1}{kv}, value shape {tuple(value.shape)}")
            return value.select(axis, h // group)
        slot = h // group if h is not None and h >= 0 else None
        if slot not in heads:
            held = tuple(q for g in heads for q in range(g * group, (g + 1) * group))
            raise KeyError(f"{name!r}: head {head!r} not cached; cached query heads {held}")
        return value.select(axis, heads.index(slot))

    def _put(self, name: str, value: Tensor, ctx: HookContext, axis: int | None,
             kv_group: int = 1) -> None:
        self._store[name] = value
        self._heads[name] = ctx.heads
        self._axis[name] = axis
        self._kv_group[name] = kv_group


def run_with_cache(model: nn.Module, tokens: Tensor,
                   names: Iterable[str] | Callable[[str], bool], heads: Any = None,
                   detach: bool = True, **kwargs: Any) -> tuple[Tensor, ActivationCache]:
    """Run ``model(tokens, **kwargs)`` and cache exactly the requested hook points.

    Args:
        names: hook names, or a predicate over names.
        heads: restrict head-axis points to these heads: a ``HeadSet`` / selector string (each
            layer's points get that layer's heads), or ``None`` for all heads. Attention keeps
            every head not cached (and not otherwise requested) on the fused path.
        detach: store detached tensors (set ``False`` to keep the graph, e.g. for a loss).

    Returns:
        ``(logits, cache)``.
    """
    embed = getattr(model, "embed", None)
    if isinstance(embed, nn.Embedding):  # data entering from outside: checked once here
        check_tokens(tokens, embed.num_embeddings, kwargs.get("attention_mask"),
                     kwargs.get("task_ids"), gate_tasks(model))
    points = hook_points(model)
    selected = [n for n in points if names(n)] if callable(names) else list(names)
    layer_heads = _layer_heads(model, heads)
    cache = ActivationCache()
    hooks = []
    for name in selected:
        if name not in points:
            resolve_points(points, name)  # raises with suggestions
        point = points[name]
        restrict = None
        if layer_heads is not None and point.head_axis is not None:
            restrict = layer_heads.get(_layer_of(name), ())
            if not restrict:
                continue

        def store(x: Tensor, ctx: HookContext, name: str = name,
                  axis: int | None = point.head_axis, group: int = point.kv_group) -> None:
            cache._put(name, x.detach() if detach else x, ctx, axis, group)

        hooks.append(Hook(name, store, restrict, read_only=detach))
    with attach_hooks(model, hooks):
        logits = model(tokens, **kwargs)
    return logits, cache


def _layer_of(name: str) -> int | None:
    parts = name.split(".")
    return int(parts[1]) if parts[0] == "blocks" and len(parts) > 1 else None


def _layer_heads(model: nn.Module, heads: Any) -> dict[int | None, tuple[int, ...]] | None:
    if heads is None:
        return None
    hs = select_heads(model, heads)
    return {layer: hs.in_layer(layer) for layer in hs.layers}
