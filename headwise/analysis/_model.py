"""Typed access to the parts of a headwise Transformer that analysis code reads."""

from __future__ import annotations

from typing import Any

from torch import nn

from headwise.heads import HeadSet


def as_any(model: nn.Module) -> Any:
    """The model, typed loosely (``nn.Module.__getattr__`` hides its sub-module types)."""
    return model


def config(model: nn.Module) -> Any:
    """The model's ``ModelConfig``."""
    return as_any(model).config


def head_set(model: nn.Module, heads: Any) -> HeadSet:
    """``heads`` (selector, Head list or HeadSet) as a HeadSet; ``None`` means every head."""
    cfg = config(model)
    if heads is None:
        return HeadSet.all(cfg.n_layers, cfg.n_heads)
    if isinstance(heads, HeadSet):
        return heads
    return HeadSet.parse(heads, cfg.n_layers, cfg.n_heads)
