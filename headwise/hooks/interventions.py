"""Head-restricted interventions returned as hooks: ablate, patch, scale, and steering.

Each returns a list of ``Hook``s to use as ``with model.hooks(ablate(model, "L1.H2")): ...``.
``point`` is an attention hook leaf with a head axis (``z`` by default, the head's output
before the output projection; also ``q``, ``k``, ``v``, ``pattern``, ``result``).
"""

from __future__ import annotations

from typing import Any, Literal

import torch
from torch import Tensor, nn

from headwise.heads import select_heads
from headwise.model.cache import run_with_cache
from headwise.model.hook_point import Hook, HookContext, hook_points

AblationMode = Literal["zero", "mean", "resample"]
_POINTS = ("q", "k", "v", "z", "pattern", "attn_scores", "result")


def _name(layer: int, point: str) -> str:
    if point not in _POINTS:
        raise ValueError(f"point: got {point!r}, expected one of {list(_POINTS)}")
    return f"blocks.{layer}.attn.hook_{point}"


def ablate(model: nn.Module, heads: Any, mode: AblationMode = "zero",
           reference: Tensor | None = None, point: str = "z", seed: int = 0,
           **forward_kwargs: Any) -> list[Hook]:
    """Knock out heads at ``point``.

    Modes: ``zero`` sets the head's value to 0; ``mean`` replaces it with its mean over the
    batch of ``reference`` tokens, per position; ``resample`` replaces each example's value by
    that of a random example of ``reference`` (seeded), per position.

    Raises:
        ValueError: unknown mode, missing ``reference``, or a reference shorter than the input.
    """
    if mode not in ("zero", "mean", "resample"):
        raise ValueError(f"mode: got {mode!r}, expected 'zero', 'mean' or 'resample'")
    hs = select_heads(model, heads)
    if mode == "zero":
        return [Hook(_name(l, point), lambda x, ctx: torch.zeros_like(x), hs.in_layer(l))
                for l in hs.layers]
    if reference is None:
        raise ValueError(f"reference: mode={mode!r} needs a batch of reference tokens")
    names = [_name(l, point) for l in hs.layers]
    with torch.no_grad():
        _, ref = run_with_cache(model, reference, names, heads=hs, **forward_kwargs)
    gen = torch.Generator().manual_seed(seed)
    hooks = []
    for layer, name in zip(hs.layers, names, strict=True):
        stored = ref[name]

        def replace(x: Tensor, ctx: HookContext, stored: Tensor = stored,
                    name: str = name) -> Tensor:
            square = point in ("pattern", "attn_scores")  # (B, h, T, T): positions last
            T, have = (x.shape[-1], stored.shape[-1]) if square else (x.shape[1], stored.shape[1])
            if have < T:
                raise ValueError(f"reference: {name} has {have} positions, the input "
                                 f"has {T}; use reference tokens at least as long")
            src = (stored[:, :, :T, :T] if square else stored[:, :T]).to(x.dtype)
            if mode == "mean":
                return src.mean(0, keepdim=True).expand_as(x).clone()
            pick = torch.randint(0, src.shape[0], (x.shape[0],), generator=gen)
            return src[pick.to(src.device)]

        hooks.append(Hook(name, replace, hs.in_layer(layer)))
    return hooks


def patch(model: nn.Module, source: Any, heads: Any, point: str = "z") -> list[Hook]:
    """Replace heads' values by those in ``source`` (an ActivationCache from another input).

    Raises:
        KeyError: the cache lacks the point or the head.
        ValueError: the cached value's shape does not match the current run's.
    """
    hs = select_heads(model, heads)
    hooks = []
    for layer in hs.layers:
        name = _name(layer, point)
        axis = source.axis_of(name)  # raises KeyError if not cached
        group = hook_points(model)[name].kv_group  # k/v hold kv heads; head() takes query heads

        def replace(x: Tensor, ctx: HookContext, name: str = name, axis: int = axis,
                    group: int = group) -> Tensor:
            assert ctx.heads is not None
            out = torch.stack([source.head(name, h * group) for h in ctx.heads], dim=axis)
            if out.shape != x.shape:
                raise ValueError(f"patch: {name} cached shape {tuple(out.shape)} does not match "
                                 f"this run's {tuple(x.shape)}")
            return out.to(device=x.device, dtype=x.dtype)

        hooks.append(Hook(name, replace, hs.in_layer(layer)))
    return hooks


def scale(model: nn.Module, heads: Any, factor: float, point: str = "z") -> list[Hook]:
    """Multiply heads' values at ``point`` by ``factor``."""
    hs = select_heads(model, heads)
    return [Hook(_name(l, point), lambda x, ctx: x * factor, hs.in_layer(l)) for l in hs.layers]


def steer(name: str, vector: Tensor, coeff: float = 1.0) -> list[Hook]:
    """Add ``coeff * vector`` to the value at hook point ``name`` (e.g. a residual stream).

    ``vector`` broadcasts against the value (``(D,)`` for ``blocks.3.hook_resid_post``).
    """
    return [Hook(name, lambda x, ctx: x + coeff * vector.to(x.dtype))]
