"""Typed access to the parts of a headwise Transformer that analysis code reads."""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar, cast

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


@contextmanager
def eval_mode(model: nn.Module) -> Iterator[None]:
    """Run a measurement in eval mode (no dropout), restoring the previous mode afterwards."""
    was_training = model.training
    model.eval()
    try:
        yield
    finally:
        model.train(was_training)


FnT = TypeVar("FnT", bound=Callable[..., Any])


def in_eval_mode(fn: FnT) -> FnT:
    """Decorator: the wrapped measurement (model as first argument) runs in eval mode."""
    @functools.wraps(fn)
    def wrapper(model: nn.Module, *args: Any, **kwargs: Any) -> Any:
        with eval_mode(model):
            return fn(model, *args, **kwargs)
    return cast(FnT, wrapper)
