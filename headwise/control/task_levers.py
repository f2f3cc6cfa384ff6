"""Levers that act per task: stochastic head ablation on a task's examples, and task loss weight.

These are the differentiable levers behind a contract's task-level clauses
(``headwise.enforce``); they follow the trainer's ``Objective`` protocol, plus ``prepare(batch)``
which the trainer calls before each forward so a lever knows each example's task:

- ``StochasticAblation(model, heads, tasks, p)``: on examples of ``tasks``, each example
  independently with probability ``weight`` (= p), the heads' outputs (``hook_z``) are zeroed for
  that forward. Training under this noise makes the tasks *not need* those heads ("T does not
  need H", an ablation ``drop_at_most`` clause); ablating the *other* heads of H's layer makes
  the tasks depend on H ("H carries T", ``drop_at_least``): dropout on heads, by task.
- ``TaskLossWeight(model, task, weight)``: adds ``weight x`` the mean cross-entropy of one
  task's examples in the batch, raising that task's share of the loss (the lever of a task
  floor: the task is never traded away for another clause).

The random draws are a pure function of the batch's tokens (hashed), so training stays
bitwise reproducible and an interrupted run resumes exactly. Both return a zero loss term when a
batch has none of their task's examples.
"""

from __future__ import annotations

import hashlib
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from headwise.control._common import as_headset
from headwise.hooks.hook_point import Hook, HookContext

IGNORE = -100


def _batch_seed(tokens: Tensor, salt: str) -> int:
    """A seed derived from the batch's tokens (and the lever's name): same batch, same draw."""
    digest = hashlib.blake2b(tokens.detach().cpu().numpy().tobytes(), digest_size=8,
                             key=salt.encode()[:64]).digest()
    return int.from_bytes(digest, "little") & ((1 << 63) - 1)


class StochasticAblation:
    """Zero ``heads`` on a random share ``weight`` of ``tasks``' examples during training.

    Args:
        model: a headwise Transformer.
        heads: the heads ablated together (selector / HeadSet).
        task_ids: task indices whose examples are ablated.
        weight: the ablation probability per example, in [0, 1].
        name: the lever's name (checkpoints store weights by name).

    Raises:
        ValueError: an empty head set or task list, or ``weight`` outside [0, 1].
    """

    def __init__(self, model: nn.Module, heads: Any, task_ids: list[int], weight: float = 0.0,
                 name: str = "ablate") -> None:
        self.heads = as_headset(model, heads, "heads")
        if not len(self.heads) or not task_ids:
            raise ValueError("StochasticAblation: expected at least one head and one task")
        if not 0.0 <= weight <= 1.0:
            raise ValueError(f"StochasticAblation: weight got {weight}, expected a probability "
                             "in [0, 1]")
        self.task_ids = sorted(set(task_ids))
        self.weight = float(weight)
        self.name = name
        self._keep: Tensor | None = None

    def prepare(self, batch: Any) -> None:
        """Draw which examples of the batch are ablated in the coming forward."""
        B = batch.tokens.shape[0]
        p = min(max(self.weight, 0.0), 1.0)
        if p <= 0.0:
            self._keep = None
            return
        gen = torch.Generator().manual_seed(_batch_seed(batch.tokens, self.name))
        draw = torch.rand(B, generator=gen) < p
        ids = batch.task_ids.detach().cpu()
        mine = torch.zeros(B, dtype=torch.bool)
        for t in self.task_ids:
            mine |= ids == t
        self._keep = (~(draw & mine)).to(torch.float32)  # (B,)

    def hooks(self) -> list[Hook]:
        def fn(z: Tensor, ctx: HookContext) -> Tensor:
            if self._keep is None:
                return z
            keep = self._keep.to(device=z.device, dtype=z.dtype)
            return z * keep[:, None, None, None]  # z: (B, T, h, Dh)
        return [Hook(f"blocks.{l}.attn.hook_z", fn, self.heads.in_layer(l))
                for l in self.heads.layers]

    def loss(self, tokens: Tensor, attention_mask: Tensor | None = None
             ) -> tuple[Tensor, dict[str, Tensor]]:
        """No loss term of its own (it acts on the forward); logs the share ablated."""
        share = torch.zeros(()) if self._keep is None else 1.0 - self._keep.mean()  # CPU draw
        self._keep = None
        return torch.zeros((), device=tokens.device), {f"{self.name}/ablated": share}


class TaskLossWeight:
    """``weight x`` mean cross-entropy of one task's examples: extra weight on that task.

    Args:
        model: a headwise Transformer (its ``hook_logits`` is read).
        task_id: the task's index.
        weight: the extra weight (0: the task keeps its mixture share).
        name: the lever's name.
    """

    def __init__(self, model: nn.Module, task_id: int, weight: float = 0.0,
                 name: str = "task_weight") -> None:
        self.task_id = int(task_id)
        self.weight = float(weight)
        self.name = name
        self._logits: Tensor | None = None
        self._batch: Any = None

    def prepare(self, batch: Any) -> None:
        self._batch = batch

    def hooks(self) -> list[Hook]:
        def grab(x: Tensor, ctx: HookContext) -> None:
            self._logits = x
        return [Hook("hook_logits", grab)]

    def loss(self, tokens: Tensor, attention_mask: Tensor | None = None
             ) -> tuple[Tensor, dict[str, Tensor]]:
        """``weight * CE`` over the task's scored positions in the last batch (0 if none)."""
        logits, batch = self._logits, self._batch
        self._logits = self._batch = None
        if logits is None or batch is None:
            raise RuntimeError(f"{self.name}: call prepare(batch) and run the forward inside "
                               "`with model.hooks(*lever.hooks())` first")
        rows = batch.task_ids.to(logits.device) == self.task_id  # (B,)
        targets = batch.targets.to(logits.device).masked_fill(~rows[:, None], IGNORE)
        valid = targets != IGNORE
        if not bool(valid.any()):
            return logits.sum() * 0.0, {f"{self.name}/loss": torch.zeros((), device=logits.device)}
        ce = F.cross_entropy(logits.float().transpose(1, 2), targets, ignore_index=IGNORE,
                             reduction="sum") / valid.sum()
        return self.weight * ce, {f"{self.name}/loss": ce.detach()}


class OnProbeData:
    """Run a pattern lever on its own batches, drawn like a probe, instead of the training batch.

    A score clause measured ``on`` a probe (``repeated``, or a declared one) is enforced on data
    drawn by that probe's generator: before each training forward, ``prepare`` draws a fresh
    batch (seeded from the training batch's tokens, so never the verification examples, and
    reproducible on resume), runs the model on it with only the inner lever's hooks, and keeps
    the inner lever's loss; ``loss`` returns it. No forward runs while ``weight`` is 0.

    Args:
        model: a headwise Transformer.
        inner: a pattern lever (``PatternObjective``, ``RoleBound``) on the clause's heads.
        sample: ``fn(seed) -> Batch`` drawing the probe-like batch.
    """

    def __init__(self, model: nn.Module, inner: Any, sample: Any) -> None:
        self.model = model
        self.inner = inner
        self.sample = sample
        self.name = inner.name
        self._term: tuple[Tensor, dict[str, Tensor]] | None = None

    @property
    def weight(self) -> float:
        return float(self.inner.weight)

    @weight.setter
    def weight(self, value: float) -> None:
        self.inner.weight = float(value)

    def prepare(self, batch: Any) -> None:
        self._term = None
        if self.weight <= 0.0:
            return
        probe = self.sample(_batch_seed(batch.tokens, self.name))
        device = next(self.model.parameters()).device
        probe = probe.to(device)
        with self.model.hooks(*self.inner.hooks()):  # type: ignore[operator]
            self.model(probe.tokens, attention_mask=probe.attention_mask,
                       task_ids=probe.task_ids)
        self._term = self.inner.loss(probe.tokens, probe.attention_mask)

    def hooks(self) -> list[Hook]:
        return []

    def loss(self, tokens: Tensor, attention_mask: Tensor | None = None
             ) -> tuple[Tensor, dict[str, Tensor]]:
        term, self._term = self._term, None
        return term if term is not None else (torch.zeros((), device=tokens.device), {})
