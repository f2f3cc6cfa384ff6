"""Shared helpers of the levers: resolving head selectors against a model's shape."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from torch import nn

from headwise.errors import SelectorError
from headwise.heads import Head, HeadSet, select_heads

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
    """Resolve a selector string, ``Head``, ``HeadSet`` or list of them against ``model``
    (``None`` is not accepted here: a lever must name its heads).

    Raises:
        SelectorError: see ``headwise.heads.select_heads``.
    """
    if heads is None:
        raise SelectorError(f"{what}: got None, expected a selector like 'L1.H2', a Head or a "
                            "HeadSet")
    return select_heads(model, heads, what)


def attention(model: nn.Module, layer: int) -> Any:
    """The attention module of ``blocks[layer]``."""
    return model.blocks[layer].attn  # type: ignore[index,union-attr]
