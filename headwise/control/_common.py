"""Shared helpers of the levers: resolving head selectors against a model's shape, masked means.

The objectives (``objectives.py``) and the regularisers (``regularizers.py``) both read these, so
neither module imports the other's internals (``objectives`` re-exports the regularisers).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from torch import Tensor, nn

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


def masked_mean(values: Tensor, valid: Tensor) -> Tensor:
    """Mean of ``values`` over ``valid`` entries (0 when there are none)."""
    valid = valid.to(values.dtype)
    return (values * valid).sum() / valid.sum().clamp_min(1.0)


def masked_means(values: Tensor, valid: Tensor, dims: tuple[int, ...]) -> Tensor:
    """``masked_mean`` over ``dims`` only, e.g. per head: (B, h, T) over (0, 2) -> (h,)."""
    valid = valid.to(values.dtype)
    return (values * valid).sum(dims) / valid.sum(dims).clamp_min(1.0)

