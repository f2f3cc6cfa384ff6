"""The lever protocol: what the trainer needs of every loss term it adds to the task loss.

One training step of a lever, in order (``headwise.training.evaluate.forward``):

1. ``prepare(batch)``: per-batch state (which examples a stochastic ablation zeroes, the batch
   a second forward will read, a probe-like batch's term); the default does nothing;
2. the model's forward with every lever's ``hooks()`` attached (hooks capture or edit values);
3. ``loss(tokens, attention_mask)`` after the hooks are detached: ``(weight * loss, logs)``;
4. ``reset()``, always, also when the forward or a loss raised: drop whatever ``prepare`` and
   the hooks left, so no per-step state leaks into the next step or an evaluation forward.

``weight`` is what a caller (a schedule, the contract enforcer) changes between steps; ``name``
is unique in a run (checkpoints store weights by name). A lever may also have an ``idle``
attribute: while it is true the step leaves the lever out entirely (no ``prepare``, no hooks,
its term 0 with no logs; ``sits_out``), so a lever that is off most of a run (the enforcer's
desaturation) does not change the forward it would otherwise watch: a pattern hook makes the
model compute the watched heads' attention explicitly rather than through the fused kernel.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol, runtime_checkable

from torch import Tensor

from headwise.model.hook_point import Hook


@runtime_checkable
class Objective(Protocol):
    """A loss term the trainer adds to the task loss (see the module docstring)."""

    name: str
    weight: float

    def prepare(self, batch: Any, step: int = 0) -> None:
        """Set per-batch state before the forward (default: none). ``step`` is the training
        step the batch is for (0 outside training): levers with random draws salt them with
        it, so a draw is not a fixed function of the example."""
        return None

    def hooks(self) -> list[Hook]:
        """Hooks to attach during the forward pass."""
        ...

    def reset(self) -> None:
        """Drop the per-step state ``prepare`` and the hooks left (default: none)."""
        return None

    def loss(self, tokens: Tensor, attention_mask: Tensor | None = None
             ) -> tuple[Tensor, dict[str, Tensor]]:
        """``(weight * loss, {log name: detached 0-d tensor})`` after the forward pass."""
        ...


def sits_out(obj: Any) -> bool:
    """Whether ``obj`` is left out of this step (its optional ``idle`` attribute is true)."""
    return bool(getattr(obj, "idle", False))


def taking_part(objectives: Sequence[Any]) -> list[Any]:
    """The objectives of ``objectives`` that take part in this step (``sits_out``)."""
    return [obj for obj in objectives if not sits_out(obj)]
