"""``run_with_cache`` and its ActivationCache: run the model, keep only the named hook points."""

from __future__ import annotations

import operator
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from torch import Tensor, nn

from headwise.errors import SelectorError
from headwise.heads import select_heads
from headwise.model.hook_names import get_act_name
from headwise.model.hook_point import Hook, HookContext, attach_hooks, hook_points, resolve_points
from headwise.model.inputs import check_tokens, gate_tasks


class ActivationCache:
    """Cached activations by hook name; head-restricted entries record which heads they hold.

    ``cache[name]`` is the tensor; ``cache["pattern", 0]`` (TransformerLens's short names,
    ``get_act_name``) is ``cache["blocks.0.attn.hook_pattern"]``. For points with a head axis,
    ``cache.heads_of(name)`` gives the head indices along it (``None``: all heads; kv heads on
    GQA ``hook_k``/``hook_v``) and ``cache.head(name, h)`` query head ``h``'s slice (its kv
    group's on those points).
    """

    def __init__(self, n_layers: int | None = None) -> None:
        self.n_layers = n_layers  # resolves negative layers in ``cache["pattern", -1]``
        self._store: dict[str, Tensor] = {}
        self._heads: dict[str, tuple[int, ...] | None] = {}
        self._axis: dict[str, int | None] = {}
        self._kv_group: dict[str, int] = {}  # query heads per stored head (GQA k/v points)

    def __getitem__(self, key: str | tuple[Any, ...]) -> Tensor:
        name = self._name(key)
        if name not in self._store:
            raise KeyError(f"{name!r} was not cached; cached: {sorted(self._store)}")
        return self._store[name]

    def _name(self, key: str | tuple[Any, ...]) -> str:
        """The hook name of ``key``: a name, a short name, or ``(short name, layer[, type])``
        as TransformerLens's cache takes (a negative layer counts from the last)."""
        if isinstance(key, str):
            return key if key in self._store else get_act_name(key)
        if not isinstance(key, tuple) or not key:
            raise KeyError(f"{key!r}: expected a hook name or (name, layer[, layer type])")
        parts = list(key)
        if len(parts) > 1 and isinstance(parts[1], int) and parts[1] < 0:
            if self.n_layers is None:
                raise KeyError(f"{key!r}: a negative layer needs the model's layer count")
            parts[1] += self.n_layers
        return get_act_name(*parts)

    def __contains__(self, name: object) -> bool:
        return name in self._store

    def __len__(self) -> int:
        return len(self._store)

    def __iter__(self) -> Iterator[str]:
        return iter(list(self._store))

    def keys(self) -> list[str]:
        return list(self._store)

    def values(self) -> list[Tensor]:
        return list(self._store.values())

    def items(self) -> list[tuple[str, Tensor]]:
        return list(self._store.items())

    def heads_of(self, name: str) -> tuple[int, ...] | None:
        """The query heads whose values ``name`` holds, as ``head`` takes them (``None``:
        every head). On GQA ``hook_k``/``hook_v`` (and ``hook_rot_k``), which hold kv heads,
        these are the query heads that read the kv heads held."""
        self[name]
        heads, group = self._heads[name], self._kv_group[name]
        if heads is None or group == 1:
            return heads
        return tuple(q for g in heads for q in range(g * group, (g + 1) * group))

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


def run_with_cache(model: nn.Module, tokens: Any,
                   names_filter: str | Iterable[str] | Callable[[str], bool] | None = None,
                   heads: Any = None, detach: bool = True, *,
                   names: str | Iterable[str] | Callable[[str], bool] | None = None,
                   **kwargs: Any) -> tuple[Any, ActivationCache]:
    """Run ``model(tokens, **kwargs)`` and cache exactly the requested hook points.

    Args:
        names_filter: which points, as TransformerLens's: a name, a list of names, a predicate
            over names, or ``None`` for every point (``hook_result`` included, which makes
            attention compute per-head results). ``names`` is the same argument.
        heads: restrict head-axis points to these heads: a ``HeadSet`` / selector string (each
            layer's points get that layer's heads), or ``None`` for all heads. Attention keeps
            every head not cached (and not otherwise requested) on the fused path.
        detach: store detached tensors (set ``False`` to keep the graph, e.g. for a loss).
        kwargs: the model's forward arguments (``attention_mask``, ``return_type``, ...).

    Returns:
        ``(model output, cache)``: the logits unless ``return_type`` says otherwise.

    Raises:
        KeyError: a name that is no hook point of the model (with the close matches).
        ValueError: both ``names_filter`` and ``names``.
    """
    if names is not None:
        if names_filter is not None:
            raise ValueError("names: got both names_filter and names, expected one (they are "
                             "the same argument)")
        names_filter = names
    embed = getattr(model, "embed", None)
    if isinstance(embed, nn.Embedding) and isinstance(tokens, Tensor):  # outside data: checked
        check_tokens(tokens, embed.num_embeddings, kwargs.get("attention_mask"),
                     kwargs.get("task_ids"), gate_tasks(model))
    points = hook_points(model)
    if names_filter is None:
        selected = list(points)
    elif isinstance(names_filter, str):
        selected = [names_filter]
    elif callable(names_filter):
        selected = [n for n in points if names_filter(n)]
    else:
        selected = list(names_filter)
    layer_heads = _layer_heads(model, heads)
    blocks = getattr(model, "blocks", None)
    cache = ActivationCache(len(blocks) if isinstance(blocks, nn.ModuleList) else None)
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
