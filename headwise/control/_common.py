"""Shared helpers of the levers: resolving head selectors against a model's shape."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from torch import nn

from headwise.errors import SelectorError
from headwise.heads import Head, HeadSet

HeadLike = str | Head | HeadSet | Iterable[str | Head]


def model_shape(model: nn.Module) -> tuple[int, int, int, int]:
    """``(n_layers, n_heads, n_kv_heads, d_head)`` of a headwise ``Transformer``.

    Raises:
        ValueError: ``model`` has no ``config`` (not a headwise model).
    """
    cfg = getattr(model, "config", None)
    if cfg is None or not hasattr(cfg, "n_heads"):
        raise ValueError(f"model: got {type(model).__name__}, expected a headwise Transformer "
                         "(with a .config ModelConfig)")
    return cfg.n_layers, cfg.n_heads, cfg.n_kv_heads, cfg.d_head


def as_headset(model: nn.Module, heads: Any, what: str = "heads") -> HeadSet:
    """Resolve a selector string, ``Head``, ``HeadSet`` or list of them against ``model``.

    Raises:
        SelectorError: malformed or out-of-range selector (message names it and the shape),
            or a ``HeadSet`` built for a model of another shape.
    """
    n_layers, n_heads, _, _ = model_shape(model)
    if isinstance(heads, HeadSet):
        if (heads.n_layers, heads.n_heads) != (n_layers, n_heads):
            raise SelectorError(
                f"{what}: HeadSet {heads} is for {heads.n_layers} layers x {heads.n_heads} heads,"
                f" the model has {n_layers} layers x {n_heads} heads")
        return heads
    if isinstance(heads, Head):
        return HeadSet([heads], n_layers, n_heads)
    if isinstance(heads, str) or isinstance(heads, Iterable):
        return HeadSet.parse(heads, n_layers, n_heads)
    raise SelectorError(f"{what}: got {heads!r}, expected a selector like 'L1.H2', a Head or a "
                        "HeadSet")


def attention(model: nn.Module, layer: int) -> Any:
    """The attention module of ``blocks[layer]``."""
    return model.blocks[layer].attn  # type: ignore[index,union-attr]
