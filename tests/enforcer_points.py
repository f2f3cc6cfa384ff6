"""Driving an ``Enforcer`` through evaluation points the way ``train()`` calls it, without
training: the tests of enforcement rules that read canned measurements."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from types import SimpleNamespace
from typing import Any


def trainer_state(model: Any, train: Any, step: int = 0, out_dir: Any = None) -> SimpleNamespace:
    """What ``train()`` hands a callback at ``step`` (``TrainState``'s fields) on rank 0: the
    model, the run's ``train`` settings, empty callback state, no stop."""
    return SimpleNamespace(step=step, model=model, extra={}, stop=False, out_dir=out_dir, rank=0,
                           config=train)


def enforcement_points(enforcer: Any, model: Any, train: Any, steps: Iterable[int],
                       read: Callable[[SimpleNamespace], Any]) -> list[Any]:
    """Call ``enforcer`` at each of ``steps`` with a trainer state holding ``model`` and the
    run's ``train`` settings; ``read(state)`` after each call, in order."""
    state = trainer_state(model, train)
    out = []
    for step in steps:
        state.step = step
        enforcer(state)
        out.append(read(state))
    return out
