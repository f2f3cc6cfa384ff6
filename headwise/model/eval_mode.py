"""Eval mode for measurements: run a model without dropout, then restore its previous mode.

Every measurement (role scores, importance, patching, reports, evaluation during training)
must see the model as inference does, and must not leave a training model in eval mode.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar, cast

from torch import nn


@contextmanager
def eval_mode(model: nn.Module) -> Iterator[None]:
    """Run the ``with`` block in eval mode (no dropout), restoring the previous mode afterwards."""
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
