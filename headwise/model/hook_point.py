"""HookPoint: an identity module at a named place in the forward pass; ``Hook`` records and
``attach_hooks`` (the ``with`` block that attaches them).

The model is built from hook points (every component declares its own), so they live in
``headwise.model``; ``headwise.hooks`` re-exports them with the interventions built on them.
A model's name -> hook point map (``Transformer.hook_dict``) is built at construction and rebuilt
by ``Transformer.setup()`` when its module tree changes, so attaching hooks at every training
step walks no module tree.

A hook function has the TransformerLens signature ``fn(value, hook) -> Tensor | None``: it may
read ``value``, return a replacement (same shape) or edit it in place. ``hook`` is a
``HookContext`` with the point's ``name`` and ``heads`` (the head indices that ``value``'s head
axis holds, in order; ``None`` when the point has no head axis).

A hook may be restricted to some heads of its layer: it then receives only those heads' slice
and its replacement is written back into those heads only. Restrictions on ``hook_k``/``hook_v``
name *query* heads and act on the kv heads they read (GQA: a kv head is shared by its group).

A hook marked ``read_only`` promises to return ``None`` and never edit its value (a capture).
It gets the value itself when it holds exactly the hook's heads (no copy), and it lets
attention compute the requested heads' scores and patterns *beside* the fused kernel instead of
routing them through the explicit path: with read-only hooks on some heads of a layer, the
forward's outputs are bit-identical to the forward without hooks; with hooks on every head,
the layer runs one explicit pass and its outputs equal the fused ones to float rounding
(``headwise.model.attention``). A pattern captured beside the kernel is off the output's path:
gradients reach q and k through it (a loss on a captured pattern trains them) but a gradient
of the output with respect to it is zero, so captures for attribution
(``run_with_cache(..., detach=False)``) are not read-only.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

HookFn = Callable[[Tensor, "HookContext"], "Tensor | None"]


@dataclass(frozen=True)
class HookContext:
    """What a hook function learns about the value it receives."""

    name: str
    heads: tuple[int, ...] | None


@dataclass(frozen=True)
class Hook:
    """A hook to attach: a point ``name`` (or a predicate over names), a function, and options.

    Args:
        name: full hook-point name (``blocks.0.attn.hook_pattern``) or ``fn(name) -> bool``.
        fn: the hook function (see module docstring).
        heads: query-head indices of that layer to restrict to; ``None`` for all heads.
        direction: ``"fwd"`` for values, ``"bwd"`` for gradients at the point.
        read_only: the function only reads its value (returns ``None``, edits nothing); see the
            module docstring. Checked: a read-only hook that returns a value raises.
    """

    name: str | Callable[[str], bool]
    fn: HookFn
    heads: tuple[int, ...] | None = None
    direction: str = "fwd"
    read_only: bool = False


class HookPoint(nn.Module):
    """Identity unless hooks are attached; its name is its module path.

    Args:
        head_axis: the axis that indexes heads in this point's value, or ``None``.
        kv_group: for ``hook_k``/``hook_v``: query heads per kv head (maps restrictions).
    """

    def __init__(self, head_axis: int | None = None, kv_group: int = 1) -> None:
        super().__init__()
        self.name = ""
        self.head_axis = head_axis
        self.kv_group = kv_group
        self._fwd: list[Hook] = []
        self._bwd: list[Hook] = []
        self.added: list[tuple[Hook, bool]] = []  # ``add_hook``'s hooks, with is_permanent

    @property
    def active(self) -> bool:
        """Whether any hook is attached (the attention module asks before materialising)."""
        return bool(self._fwd or self._bwd)

    @property
    def writes(self) -> bool:
        """Whether an attached hook may change the value or reads its gradient (not read-only)."""
        return bool(self._bwd) or any(not h.read_only for h in self._fwd)

    def requested_heads(self) -> frozenset[int] | None:
        """Head indices that attached hooks need (``None``: none attached).

        Returns every head (as the sentinel ``frozenset({-1})``) when any hook is unrestricted.
        """
        hooks = self._fwd + self._bwd
        if not hooks:
            return None
        out: set[int] = set()
        for h in hooks:
            if h.heads is None:
                return frozenset({-1})
            out.update(h.heads)
        return frozenset(out)

    def attach(self, hook: Hook) -> None:
        """Attach ``hook`` (use ``model.hooks(...)``, which also detaches)."""
        (self._fwd if hook.direction == "fwd" else self._bwd).append(hook)

    def detach(self, hook: Hook) -> None:
        """Remove ``hook`` if attached."""
        for lst in (self._fwd, self._bwd):
            if hook in lst:
                lst.remove(hook)

    def forward(self, x: Tensor, heads: tuple[int, ...] | None = None) -> Tensor:
        """Run attached forward hooks on ``x`` and register backward hooks on it.

        Args:
            x: the value at this point.
            heads: which heads ``x``'s head axis holds (``None``: all, in order).
        """
        if not self._fwd and not self._bwd:
            return x
        for hook in self._fwd:
            x = self._call(hook, x, heads)
        if self._bwd and x.requires_grad:
            x = x.view_as(x)  # a fresh node, so gradient hooks see this point only
            for hook in self._bwd:
                x.register_hook(lambda g, hook=hook: self._call(hook, g, heads))
        return x

    def _call(self, hook: Hook, x: Tensor, heads: tuple[int, ...] | None) -> Tensor:
        sel = self._positions(hook.heads, heads)
        if hook.read_only:
            self._read(hook, x, heads, sel)
            return x
        if sel is None:
            out = hook.fn(x, HookContext(self.name, heads))
            return x if out is None else _checked(out, x, self.name)
        axis = self.head_axis
        assert axis is not None
        idx = torch.tensor(sel, device=x.device)
        part = x.index_select(axis, idx)
        out = hook.fn(part, HookContext(self.name, self._local(sel, heads)))
        if out is None:  # the hook may have edited `part` in place: write it back
            out = part
        return x.index_copy(axis, idx, _checked(out, part, self.name))

    def _read(self, hook: Hook, x: Tensor, heads: tuple[int, ...] | None,
              sel: list[int] | None) -> None:
        """Run a read-only hook: on ``x`` itself when it holds exactly the hook's heads."""
        part, local = x, heads
        if sel is not None and self.head_axis is not None:
            local = self._local(sel, heads)
            if sel != list(range(x.shape[self.head_axis])):
                part = x.index_select(self.head_axis, torch.tensor(sel, device=x.device))
        if hook.fn(part, HookContext(self.name, local)) is not None:
            raise ValueError(f"read-only hook at {self.name!r} returned a value, expected None "
                             "(attach it without read_only to replace the value)")

    @staticmethod
    def _local(sel: list[int], heads: tuple[int, ...] | None) -> tuple[int, ...]:
        """The head indices at positions ``sel`` of a value holding ``heads``."""
        return tuple((heads[i] if heads is not None else i) for i in sel)

    def _positions(self, wanted: tuple[int, ...] | None,
                   present: tuple[int, ...] | None) -> list[int] | None:
        """Positions along the head axis that a restricted hook sees; ``None`` for all."""
        if wanted is None or self.head_axis is None:
            return None
        want = sorted({h // self.kv_group for h in wanted})
        if present is None:
            return want
        return [i for i, h in enumerate(present) if h in want]


def _checked(out: object, like: Tensor, name: str) -> Tensor:
    if not isinstance(out, Tensor) or out.shape != like.shape:
        got = tuple(out.shape) if isinstance(out, Tensor) else type(out).__name__
        raise ValueError(
            f"hook at {name!r} returned {got}, expected a tensor of shape {tuple(like.shape)}"
        )
    return out


def hook_points(model: nn.Module) -> dict[str, HookPoint]:
    """Every hook point of ``model`` by its name, in module order (do not mutate the dict).

    A model that keeps a map (``Transformer.hook_dict``, built at construction and rebuilt by
    ``Transformer.setup()`` whenever its module tree changes) returns it, so attaching hooks
    walks no module tree; so does a wrapper that forwards attribute lookups to such a model
    (``torch.compile``'s ``OptimizedModule``). Any other module is walked at each call; its
    points keep their names and only unnamed ones take their module path.
    """
    kept = getattr(model, "hook_dict", None)
    if isinstance(kept, dict):
        return kept
    points: dict[str, HookPoint] = {}
    for path, m in model.named_modules():
        if isinstance(m, HookPoint):
            m.name = m.name or path
            points[m.name] = m
    return points


def name_hook_points(model: nn.Module) -> dict[str, HookPoint]:
    """Name every hook point of ``model`` by its module path (a point moved in from another
    model takes its new path) and return them by name, in module order: one walk of the tree."""
    points: dict[str, HookPoint] = {}
    for path, m in model.named_modules():
        if isinstance(m, HookPoint):
            m.name = path
            points[path] = m
    return points


def tree_changed(model: nn.Module) -> None:
    """Say that modules were put into ``model`` or taken out: a model that keeps a hook map
    (``Transformer``, or a wrapper forwarding to one) maps its tree again (``setup()``); any
    other module is walked at each lookup anyway. Every headwise function that changes a
    model's module tree calls it."""
    if isinstance(getattr(model, "hook_dict", None), dict):
        model.setup()  # type: ignore[operator]  # a Transformer's method


def tree_memo(model: nn.Module, key: str, build: Callable[[nn.Module], Any]) -> Any:
    """``build(model)``, kept in the model's memo of what its module tree holds until the tree
    changes (``Transformer.setup()`` empties it); a module that keeps no memo builds at every
    call. What a walk of the tree finds, without walking it at every forward."""
    memo = getattr(model, "tree_memos", None)
    if not isinstance(memo, dict):
        return build(model)
    if key not in memo:
        memo[key] = build(model)
    return memo[key]


def _as_hooks(items: Iterable[Any]) -> list[Hook]:
    out: list[Hook] = []
    for item in items:
        if isinstance(item, Hook):
            out.append(item)
        elif isinstance(item, tuple) and 2 <= len(item) <= 3:  # (name, fn[, heads])
            out.append(Hook(item[0], item[1], tuple(item[2]) if len(item) == 3 else None))
        elif isinstance(item, Iterable) and not isinstance(item, (str, bytes)):
            out.extend(_as_hooks(item))
        else:
            raise TypeError(f"hooks: expected Hook or (name, fn[, heads]) tuples, got {item!r}")
    return out


@contextmanager
def attach_hooks(model: nn.Module, *hooks: Any) -> Iterator[None]:
    """Attach hooks while the block runs; all are detached on exit, even on error.

    Args:
        model: a model containing HookPoints.
        hooks: ``Hook`` objects, ``(name, fn)`` / ``(name, fn, heads)`` tuples, or lists of them.

    Raises:
        KeyError: a name that is no hook point of the model (with the close matches).
    """
    points = hook_points(model)
    attached: list[tuple[HookPoint, Hook]] = []
    try:
        for hook in _as_hooks(hooks):
            for point in resolve_points(points, hook.name):
                point.attach(hook)
                attached.append((point, hook))
        yield
    finally:
        for point, hook in attached:
            point.detach(hook)


def resolve_points(points: dict[str, HookPoint],
                   name: str | Callable[[str], bool]) -> list[HookPoint]:
    """The points a hook's ``name`` (or predicate) selects.

    Raises:
        KeyError: a name that is no hook point (with the close matches).
    """
    if callable(name):
        return [p for n, p in points.items() if name(n)]
    if name not in points:
        from difflib import get_close_matches

        close = get_close_matches(name, list(points), n=3)
        raise KeyError(f"{name!r} is not a hook point of this model; close: {close} (a module "
                       "put into the model since it was built is mapped by model.setup())")
    return [points[name]]
