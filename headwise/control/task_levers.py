"""Levers that act per task: head ablation on a task's examples, the ablated margin, task weight.

These are the differentiable levers behind a contract's task-level clauses
(``headwise.contract``); they follow the trainer's ``Objective`` protocol, whose
``prepare(batch)`` the trainer calls before each forward so a lever knows each example's task:

- ``StochasticAblation(model, heads, tasks, p, mode)``: on examples of ``tasks``, each example
  independently with probability ``weight`` (= p), the heads' outputs (``hook_z``) are ablated
  for that forward: zeroed (``mode="zero"``), replaced by their mean over the batch's examples
  of those tasks, per position (``"mean"``), or by another such example's (``"resample"``): the
  ablation the clause is measured with (``headwise.hooks.ablate``). Training under this noise
  makes the tasks *not need* those heads ("T does not need H", an ablation ``drop_at_most``
  clause); ablating the *other* heads of H's layer makes H *sufficient* for the tasks: dropout
  on heads, by task.
- ``AblatedMargin(model, heads, tasks)``: makes the tasks *need* the heads ("H carries T", a
  ``drop_at_least`` clause): a second forward with the heads zeroed, and a multiclass hinge on
  its logits, ``relu(delta + z_target - max_{j != target} z_j)`` per scored position, which is
  zero exactly where the ablated model predicts a wrong token by a margin ``delta``. The clause
  measures the ablated accuracy, the share of positions with ``z_target > max_j z_j``; the hinge
  is its convex surrogate, and unlike ``-CE`` its gradient does not vanish when the ablated
  model is confidently right. Its ``mode`` ablates as ``StochasticAblation``'s does.
- ``TaskLossWeight(model, task, weight)``: adds ``weight x`` the mean cross-entropy of one
  task's examples in the batch, raising that task's share of the loss (the lever of a task
  floor: the task is never traded away for another clause).

The random draws are a pure function of each example's tokens and the training step, hashed
on the tokens' device (``row_uniforms`` salted by ``step_salt``), so training stays bitwise
reproducible, an interrupted run resumes exactly, and no lever reads a value back to the host
during a training step. The step matters: on a task with few distinct inputs, draws hashed from
the tokens alone would ablate the same examples at every step, and the model would learn which
ones to answer through the ablated heads. As dropout does, ``StochasticAblation`` ablates
nothing while the model is in eval mode.
"""

from __future__ import annotations

import dataclasses
import hashlib
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from headwise.control._common import as_headset
from headwise.control.objective import Objective
from headwise.model.hook_point import Hook, HookContext

IGNORE = -100
_PRIME = 2_147_483_629  # below 2**31: every product of two residues fits in int64
MARGIN_DELTA = 1.0  # AblatedMargin: logit margin by which the ablated prediction must be wrong
PROBE_POOL = 64  # OnProbeData: batches drawn once, rows picked per step by hash


def salt_of(name: str) -> int:
    """A lever's salt (an int below the hash prime) from its name, computed once on the host."""
    digest = hashlib.blake2b(name.encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") % _PRIME


def step_salt(name: str, step: int) -> int:
    """A lever's salt for the draws of one training step (on the host, no tensor read)."""
    return salt_of(f"{name}@{step}")


def row_uniforms(tokens: Tensor, salt: int) -> Tensor:
    """(B,) numbers in [0, 1): a pure function of each row of ``tokens`` (B, T) and ``salt``.

    A polynomial hash of the row modulo a prime below 2**31, then two multiply-add-xorshift
    rounds; all in int64 on the tokens' device, so no value returns to the host.
    """
    T = tokens.shape[1]
    pos = torch.arange(1, T + 1, device=tokens.device, dtype=torch.int64)
    w = (pos * 2_654_435_761 + salt) % _PRIME  # (T,) per-position weights
    h = ((tokens.long() % _PRIME) * w % _PRIME).sum(1) % _PRIME  # (B,)
    for a, c in ((1_103_515_245, 12_345), (69_069, salt)):
        h = (h * a + c) % _PRIME
        h = h ^ (h >> 7)
    return (h % _PRIME).to(torch.float32) / _PRIME


def rows_of(task_ids: Tensor, tasks: list[int]) -> Tensor:
    """(B,) bool: the rows whose task is one of ``tasks`` (on task_ids' device; comparisons with
    Python ints, so no tensor is copied from the host)."""
    mine = torch.zeros_like(task_ids, dtype=torch.bool)
    for t in tasks:
        mine |= task_ids == t
    return mine


ABLATION_MODES = ("zero", "mean", "resample")


def _sources(tokens: Tensor, rows: Tensor, salt: int) -> Tensor:
    """(B,) for each row of ``rows`` another such row of the batch (a random cycle through
    them, hashed from the tokens: no host sync); the others map to themselves."""
    B = tokens.shape[0]
    key = (~rows).to(torch.float32) * 2.0 + row_uniforms(tokens, salt)  # rows first
    order = key.argsort()  # order[j]: the row at rank j
    rank = torch.empty_like(order)
    rank[order] = torch.arange(B, device=tokens.device)
    k = rows.sum().clamp_min(1)
    src = order[(rank + 1) % k]
    return torch.where(rows, src, torch.arange(B, device=tokens.device))


def _ablated(z: Tensor, mode: str, rows: Tensor, src: Tensor | None) -> Tensor:
    """What ``mode`` puts in place of ``z`` (B, T, h, Dh): zeros, the mean over ``rows`` per
    position, or row ``src[b]``'s value (the replacement carries no gradient, as a fixed
    reference would not)."""
    if mode == "zero":
        return torch.zeros_like(z)
    ref = z.detach()
    if mode == "mean":
        w = rows.to(z.dtype)[:, None, None, None]
        mean = (ref * w).sum(0, keepdim=True) / w.sum().clamp_min(1.0)
        return mean.expand_as(z)
    assert src is not None
    return ref[src]


def _check_mode(what: str, mode: str) -> str:
    if mode not in ABLATION_MODES:
        raise ValueError(f"{what}: mode got {mode!r}, expected one of {list(ABLATION_MODES)}")
    return mode


def _check(what: str, heads: Any, task_ids: list[int]) -> list[int]:
    if not len(heads) or not task_ids:
        raise ValueError(f"{what}: expected at least one head and one task")
    return sorted(set(task_ids))


class StochasticAblation(Objective):
    """Zero ``heads`` on a random share ``weight`` of ``tasks``' examples during training.

    Args:
        model: a headwise Transformer.
        heads: the heads ablated together (selector / HeadSet).
        task_ids: task indices whose examples are ablated.
        weight: the ablation probability per example, in [0, 1].
        name: the lever's name (checkpoints store weights by name; it salts the draws).
        mode: ``zero``, ``mean`` or ``resample`` (see the module docstring).

    Raises:
        ValueError: an empty head set or task list, ``weight`` outside [0, 1], or an unknown
            mode.
    """

    def __init__(self, model: nn.Module, heads: Any, task_ids: list[int], weight: float = 0.0,
                 name: str = "ablate", mode: str = "zero") -> None:
        self.mode = _check_mode("StochasticAblation", mode)
        self.heads = as_headset(model, heads, "heads")
        self.task_ids = _check("StochasticAblation", self.heads, task_ids)
        if not 0.0 <= weight <= 1.0:
            raise ValueError(f"StochasticAblation: weight got {weight}, expected a probability "
                             "in [0, 1]")
        self.weight = float(weight)
        self.name = name
        self.model = model
        self._keep: Tensor | None = None
        self._rows: Tensor | None = None
        self._src: Tensor | None = None

    def prepare(self, batch: Any, step: int = 0) -> None:
        """Draw which examples of the batch are ablated in the coming forward (on its device);
        none in eval mode."""
        p = min(max(self.weight, 0.0), 1.0)
        if p <= 0.0 or not self.model.training:
            self.reset()
            return
        salt = step_salt(self.name, step)
        draw = row_uniforms(batch.tokens, salt) < p  # (B,)
        rows = rows_of(batch.task_ids, self.task_ids)
        self._keep = (~(draw & rows)).to(torch.float32)
        self._rows = rows
        self._src = (_sources(batch.tokens, rows, salt + 1) if self.mode == "resample"
                     else None)

    def hooks(self) -> list[Hook]:
        def fn(z: Tensor, ctx: HookContext) -> Tensor:
            if self._keep is None:
                return z
            keep = self._keep.to(dtype=z.dtype)[:, None, None, None]  # z: (B, T, h, Dh)
            if self.mode == "zero":
                return z * keep
            assert self._rows is not None
            return z * keep + _ablated(z, self.mode, self._rows, self._src) * (1 - keep)
        return [Hook(f"blocks.{l}.attn.hook_z", fn, self.heads.in_layer(l))
                for l in self.heads.layers]

    def reset(self) -> None:
        self._keep = self._rows = self._src = None

    def loss(self, tokens: Tensor, attention_mask: Tensor | None = None
             ) -> tuple[Tensor, dict[str, Tensor]]:
        """No loss term of its own (it acts on the forward); logs the share ablated."""
        zero = torch.zeros((), device=tokens.device)
        share = zero if self._keep is None else 1.0 - self._keep.mean()
        self.reset()
        return zero, {f"{self.name}/ablated": share}


class _SecondForward(Objective):
    """Shared by the levers that run the model a second time on the training batch."""

    def __init__(self, what: str, model: nn.Module, heads: Any, task_ids: list[int],
                 weight: float, name: str) -> None:
        self.model = model
        self.heads = as_headset(model, heads, "heads")
        self.task_ids = _check(what, self.heads, task_ids)
        self.weight = float(weight)
        self.name = name
        self._batch: Any = None
        self._step = 0

    def prepare(self, batch: Any, step: int = 0) -> None:
        self._batch = batch if self.weight > 0.0 else None  # no second forward at weight 0
        self._step = step

    def reset(self) -> None:
        self._batch = None

    def _run(self, batch: Any, hooks: list[Hook]) -> Tensor:
        with self.model.hooks(*hooks):  # type: ignore[operator]
            out: Tensor = self.model(batch.tokens, attention_mask=batch.attention_mask,
                                     task_ids=batch.task_ids)
        return out  # (B, T, V)

    def _idle(self, tokens: Tensor, key: str) -> tuple[Tensor, dict[str, Tensor]]:
        zero = torch.zeros((), device=tokens.device)
        return zero, {f"{self.name}/{key}": zero}


class AblatedMargin(_SecondForward):
    """``weight x`` the mean hinge ``relu(delta + z_y - max_{j != y} z_j)`` of the model with
    ``heads`` zeroed, over the scored positions of ``tasks``' examples (see module docstring).

    Args:
        model: a headwise Transformer.
        heads: the heads the tasks must need (zeroed together in the second forward).
        task_ids: task indices whose examples are scored.
        weight: the term's weight (0: no second forward).
        name: the lever's name.
        delta: the logit margin.
        mode: how the heads are ablated: ``zero``, ``mean`` or ``resample`` (over the
            batch's examples of ``tasks``).
    """

    def __init__(self, model: nn.Module, heads: Any, task_ids: list[int], weight: float = 0.0,
                 name: str = "ablated-margin", delta: float = MARGIN_DELTA,
                 mode: str = "zero") -> None:
        super().__init__("AblatedMargin", model, heads, task_ids, weight, name)
        self.delta = float(delta)
        self.mode = _check_mode("AblatedMargin", mode)

    def _ablation_hooks(self, batch: Any) -> list[Hook]:
        rows = rows_of(batch.task_ids, self.task_ids)
        src = (_sources(batch.tokens, rows, step_salt(self.name, self._step))
               if self.mode == "resample" else None)

        def fn(z: Tensor, ctx: HookContext) -> Tensor:
            return _ablated(z, self.mode, rows, src)
        return [Hook(f"blocks.{l}.attn.hook_z", fn, self.heads.in_layer(l))
                for l in self.heads.layers]

    def hooks(self) -> list[Hook]:
        return []

    def loss(self, tokens: Tensor, attention_mask: Tensor | None = None
             ) -> tuple[Tensor, dict[str, Tensor]]:
        """The weighted hinge; logs the ablated accuracy on the scored positions."""
        batch, self._batch = self._batch, None
        if batch is None:
            return self._idle(tokens, "ablated_accuracy")
        logits = self._run(batch, self._ablation_hooks(batch))  # (B, T, V)
        rows = rows_of(batch.task_ids, self.task_ids)
        hinge, right = margin_hinge(logits, batch.targets, rows, self.delta)
        return self.weight * hinge, {f"{self.name}/ablated_accuracy": right.detach()}


def margin_hinge(logits: Tensor, targets: Tensor, rows: Tensor, delta: float
                 ) -> tuple[Tensor, Tensor]:
    """The mean hinge ``relu(delta + z_y - max_{j != y} z_j)`` over the scored positions of
    ``rows`` (B,) of ``logits`` (B, T, V), and the share of them predicted right (``z_y`` above
    every other logit: what an ablated accuracy counts)."""
    logits = logits.float()
    valid = (targets != IGNORE) & rows[:, None]  # (B, T)
    y = targets.clamp_min(0)[..., None]  # (B, T, 1)
    z_y = logits.gather(-1, y)[..., 0]  # (B, T)
    best_other = logits.scatter(-1, y, float("-inf")).amax(-1)  # (B, T)
    n = valid.sum().clamp_min(1)
    hinge = (torch.relu(delta + z_y - best_other) * valid).sum() / n
    right = ((z_y > best_other) & valid).sum() / n
    return hinge, right


class TaskLossWeight(Objective):
    """``weight x`` mean cross-entropy of one task's examples: extra weight on that task.

    Under Adam the update is nearly invariant to a common scale of the whole loss, so raising
    *every* task's weight together changes little by itself; what it does change is the task
    loss's share against the other levers' terms (see docs/levers.md, "Task floors").

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

    def prepare(self, batch: Any, step: int = 0) -> None:
        self._batch = batch

    def hooks(self) -> list[Hook]:
        def grab(x: Tensor, ctx: HookContext) -> None:
            self._logits = x
        return [Hook("hook_logits", grab)]

    def reset(self) -> None:
        self._logits = self._batch = None

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
        n = (targets != IGNORE).sum().clamp_min(1)  # no branch on the count: no host sync
        ce = F.cross_entropy(logits.float().transpose(1, 2), targets, ignore_index=IGNORE,
                             reduction="sum") / n
        return self.weight * ce, {f"{self.name}/loss": ce.detach()}


class OnProbeData(Objective):
    """Run a pattern lever on batches drawn like a probe, instead of the training batch.

    A score clause measured ``on`` a probe (``repeated``, or a declared one) is enforced on data
    drawn by that probe's generator: at the first step where ``weight`` > 0, ``sample(n, seed)``
    draws a pool of ``PROBE_POOL x B`` examples (seeded from the lever's name: never the
    verification examples, and the same pool after a resume) onto the training device; before
    each training forward, ``prepare`` picks B rows of the pool by hashing the training batch's
    rows with the step (``row_uniforms``, on the device), runs the model on them with only the
    inner lever's hooks and keeps the inner lever's loss; ``loss`` returns it. No forward runs
    while ``weight`` is 0.

    Args:
        model: a headwise Transformer.
        inner: a pattern lever (``PatternObjective``, ``RoleBound``) on the clause's heads.
        sample: ``fn(n, seed) -> Batch`` drawing ``n`` probe-like examples.
    """

    def __init__(self, model: nn.Module, inner: Any, sample: Any) -> None:
        self.model = model
        self.inner = inner
        self.sample = sample
        self.name = inner.name
        self._term: tuple[Tensor, dict[str, Tensor]] | None = None
        self._pool: Any = None

    @property
    def weight(self) -> float:
        return float(self.inner.weight)

    @weight.setter
    def weight(self, value: float) -> None:
        self.inner.weight = float(value)

    def _rows(self, batch: Any, step: int) -> Any:
        B = batch.tokens.shape[0]
        if self._pool is None or self._pool.tokens.shape[0] != PROBE_POOL * B:
            device = batch.tokens.device
            self._pool = self.sample(PROBE_POOL * B, salt_of(self.name)).to(device)
        n = self._pool.tokens.shape[0]
        idx = (row_uniforms(batch.tokens, step_salt(self.name, step)) * n).long().clamp_max(n - 1)
        pool = self._pool
        mask = None if pool.attention_mask is None else pool.attention_mask[idx]
        return dataclasses.replace(pool, tokens=pool.tokens[idx], targets=pool.targets[idx],
                                   attention_mask=mask, task_ids=pool.task_ids[idx])

    def prepare(self, batch: Any, step: int = 0) -> None:
        self._term = None
        if self.weight <= 0.0:
            return
        probe = self._rows(batch, step)
        self.inner.prepare(probe, step)  # the inner objective sees the batch it is applied to
        with self.model.hooks(*self.inner.hooks()):  # type: ignore[operator]
            self.model(probe.tokens, attention_mask=probe.attention_mask,
                       task_ids=probe.task_ids)
        self._term = self.inner.loss(probe.tokens, probe.attention_mask)

    def hooks(self) -> list[Hook]:
        return []

    def reset(self) -> None:
        self._term = None  # the probe pool is drawn once per run and kept
        self.inner.reset()

    def batch_values(self) -> Tensor | None:
        """The inner lever's values on the last probe-like batch (``None`` at weight 0: no
        forward ran)."""
        values = getattr(self.inner, "batch_values", None)
        return None if values is None else values()

    def loss(self, tokens: Tensor, attention_mask: Tensor | None = None
             ) -> tuple[Tensor, dict[str, Tensor]]:
        term, self._term = self._term, None
        return term if term is not None else (torch.zeros((), device=tokens.device), {})
