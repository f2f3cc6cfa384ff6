"""Levers on paths: edges ablated in their receivers' inputs while training, by task.

The differentiable levers behind ``path`` and ``circuit`` clauses (``headwise.contract``); the
ablation is path patching's (``headwise.analysis.paths``, direct-path semantics): the receiver
reads ``x_v - sum_u (a_u - a_u')`` with ``a_u`` the sender's output in this forward and
``a_u'`` its replacement, and every other reader of the sender is untouched.

- ``StochasticPathAblation(model, edges, tasks, p, mode)``: on examples of ``tasks``, each
  example independently with probability ``weight`` (= p), the ``edges`` are ablated together
  for that forward: the sender's output replaced by zero (``mode="zero"``) or by its clean mean
  per position (``"mean"``), as path patching's is: over a fixed pool of ``MEAN_POOL`` training
  examples of the tasks, run without gradient at each step, when a ``pool`` sampler is given
  (the contract's levers have one), else over the rows of the batch the draw left clean; the
  replacement carries no gradient, as a fixed reference would not. Training under this noise
  makes the tasks *not need* those edges: the lever of a path's ``drop_at_most``, of a
  circuit's outside (so the circuit alone keeps the task), and, on the other edges into a
  receiver, of a path that must be *sufficient*.
- ``PathAblatedMargin(model, edges, tasks)``: makes the tasks *need* the edges (a path's
  ``drop_at_least``): a second forward with the edges ablated on every example of ``tasks``,
  and the multiclass hinge of ``headwise.control.task_levers.AblatedMargin`` on its logits
  (``mean``: the senders' clean means, from the pool or a forward without gradient).

Draws are hashed from each example's tokens and the step (``row_uniforms``), so training stays
bitwise reproducible and resumes exactly; nothing is read back to the host during a step. As
dropout does, ``StochasticPathAblation`` ablates nothing in eval mode.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import torch
from torch import Tensor, nn

from headwise.control.objective import Objective
from headwise.control.task_levers import (
    MARGIN_DELTA,
    margin_hinge,
    row_uniforms,
    rows_of,
    salt_of,
    step_salt,
)
from headwise.hooks.graph import Edge, Node, model_shape
from headwise.hooks.path_run import (
    AblatedRun,
    ablation_targets,
    capture,
    sender_outputs,
    stream_names,
)
from headwise.model.eval_mode import eval_mode
from headwise.model.hook_point import Hook, HookContext

PATH_MODES = ("mean", "zero")


class _RowMix:
    """What ``AblatedRun`` reads of a training forward: each sender's replacement, per row.

    ``ablated`` (B,) is 1 on the rows whose edges are ablated; on the others the replacement is
    the sender's own output, so their receivers read exactly what a clean forward gives. The
    mean a ``mean`` ablation puts in is a clean one, as path patching's is: ``means`` given
    (per sender, (1, T, ...)), or else the mean over the ``ref`` rows (B,) of this forward,
    rows this lever leaves clean (padding left out; no such row: zero).
    """

    def __init__(self, model: nn.Module, mode: str) -> None:
        self.shape = model_shape(model)
        self.blocks: Any = model.blocks
        self.mode = mode
        self.kw: dict[str, Any] = {}
        self.ablated: Tensor | None = None
        self.ref: Tensor | None = None
        self.mask: Tensor | None = None
        self.means: dict[Node, Tensor] | None = None

    def set(self, batch: Any, ablated: Tensor, ref: Tensor,
            means: dict[Node, Tensor] | None = None) -> None:
        self.kw = {"task_ids": batch.task_ids}
        self.mask = batch.attention_mask
        self.ablated, self.ref, self.means = ablated, ref, means

    def clear(self) -> None:
        self.kw, self.ablated, self.ref, self.mask, self.means = {}, None, None, None, None

    def replacement(self, node: Node, current: Tensor) -> Tensor:
        """``current`` (B, T, ...) with the ablated rows' values replaced (zero or the mean)."""
        assert self.ablated is not None and self.ref is not None
        m = self.ablated.to(current.dtype).view(-1, *[1] * (current.dim() - 1))  # (B, 1, ...)
        if self.mode == "zero":
            return current * (1 - m)
        mean = (self.means[node] if self.means is not None
                else row_mean(current.detach(), self.ref, self.mask))
        return current * (1 - m) + mean * m


def row_mean(values: Tensor, rows: Tensor, mask: Tensor | None) -> Tensor:
    """(1, T, ...) the mean of ``values`` (B, T, ...) over ``rows`` (B,) per position, padding
    (``mask`` (B, T) == 0) left out; zero where no row counts."""
    w = rows.to(values.dtype)[:, None].expand(values.shape[:2])  # (B, T)
    if mask is not None:
        w = w * mask.to(values.dtype)
    w = w.reshape(*w.shape, *[1] * (values.dim() - 2))
    return (values * w).sum(0, keepdim=True) / w.sum(0, keepdim=True).clamp_min(1.0)


MEAN_POOL = 128  # training examples whose clean mean a ``mean`` path ablation puts in


class _PoolMeans:
    """Every sender's clean mean over a fixed pool of the lever's task examples, recomputed
    from the current weights at each step (a forward without gradient, in eval mode, before the
    training forward). The pool is drawn once, from a seed hashed from the lever's name, so a
    resumed run draws the same pool and computes the same means. A per-batch mean over a
    few clean rows is noisier than the token signal a circuit's heads must learn to read
    (docs/benchmarks.md, "Paths and circuits in the public suite")."""

    def __init__(self, model: nn.Module, sample: Callable[[int, int], Any], name: str) -> None:
        self.model, self.sample, self.name = model, sample, name
        self._pool: Any = None

    def __call__(self, device: torch.device) -> dict[Node, Tensor]:
        if self._pool is None:
            self._pool = self.sample(MEAN_POOL, salt_of(self.name)).to(device)
        rows = torch.ones(self._pool.tokens.shape[0], dtype=torch.bool, device=device)
        with eval_mode(self.model):
            return clean_means(self.model, self._pool, rows)


def clean_means(model: nn.Module, batch: Any, rows: Tensor) -> dict[Node, Tensor]:
    """Every sender's mean output over ``rows`` (B,) of ``batch``, per position (padding left
    out), from one forward without gradient and without ablation."""
    kw = {"attention_mask": batch.attention_mask, "task_ids": batch.task_ids}
    with torch.no_grad():
        _, values = capture(model, batch.tokens, kw, stream_names(model_shape(model)))
        outs = sender_outputs(model, values, batch.task_ids)
    return {n: row_mean(v, rows, batch.attention_mask) for n, v in outs.items()}


class _PathRun:
    """One ``AblatedRun`` kept for the life of a lever: its hooks are made once (the trainer
    attaches the same hook objects at every step) and act only while ``active``."""

    def __init__(self, model: nn.Module, edges: Iterable[Edge], mode: str) -> None:
        self.mix = _RowMix(model, mode)
        self.run = AblatedRun(self.mix, ablation_targets(edges, self.mix.shape))
        self.active = False

    def start(self, batch: Any, ablated: Tensor, ref: Tensor,
              means: dict[Node, Tensor] | None = None) -> None:
        self.run.clear()
        self.mix.set(batch, ablated, ref, means)
        self.active = True

    def stop(self) -> None:
        self.active = False
        self.run.clear()
        self.mix.clear()

    def hooks(self) -> list[Hook]:
        return [Hook(h.name, self._gated(h.fn), h.heads, h.direction, h.read_only)
                for h in self.run.hooks()]

    def _gated(self, fn: Callable[[Tensor, Any], Any]) -> Callable[[Tensor, HookContext], Any]:
        def gated(value: Tensor, ctx: HookContext) -> Any:
            return fn(value, ctx) if self.active else None
        return gated


def _check(what: str, edges: Iterable[Edge], task_ids: list[int], mode: str) -> list[int]:
    if not list(edges) or not task_ids:
        raise ValueError(f"{what}: expected at least one edge and one task")
    if mode not in PATH_MODES:
        raise ValueError(f"{what}: mode got {mode!r}, expected one of {list(PATH_MODES)}")
    return sorted(set(task_ids))


class StochasticPathAblation(Objective):
    """Ablate ``edges`` together on a random share ``weight`` of ``tasks``' examples.

    Args:
        model: a headwise Transformer.
        edges: the edges ablated together (``headwise.hooks.graph.Edge``).
        task_ids: task indices whose examples are ablated.
        weight: the ablation probability per example, in [0, 1].
        name: the lever's name (checkpoints store weights by name; it salts the draws).
        mode: ``mean`` (default) or ``zero`` (see the module docstring).
        pool: ``fn(n, seed)`` drawing ``n`` training examples of the tasks: ``mean`` then
            puts in the senders' clean means over a fixed pool of them (``MEAN_POOL``); without
            it, over the rows of the batch the draw left clean.

    Raises:
        ValueError: no edge or task, ``weight`` outside [0, 1], or an unknown mode.
    """

    def __init__(self, model: nn.Module, edges: Iterable[Edge], task_ids: list[int],
                 weight: float = 0.0, name: str = "ablate-paths", mode: str = "mean",
                 pool: Callable[[int, int], Any] | None = None) -> None:
        self.edges = tuple(edges)
        self.task_ids = _check("StochasticPathAblation", self.edges, task_ids, mode)
        if not 0.0 <= weight <= 1.0:
            raise ValueError(f"StochasticPathAblation: weight got {weight}, expected a "
                             "probability in [0, 1]")
        self.model, self.mode = model, mode
        self.weight = float(weight)
        self.name = name
        self._run = _PathRun(model, self.edges, mode)
        self._means = None if pool is None or mode == "zero" else _PoolMeans(model, pool, name)
        self._share: Tensor | None = None

    def prepare(self, batch: Any, step: int = 0) -> None:
        """Draw which examples of the batch have the edges ablated in the coming forward."""
        p = min(max(self.weight, 0.0), 1.0)
        if p <= 0.0 or not self.model.training:
            self.reset()
            return
        rows = rows_of(batch.task_ids, self.task_ids)
        draw = row_uniforms(batch.tokens, step_salt(self.name, step)) < p  # (B,)
        ablated = draw & rows
        means = None if self._means is None else self._means(batch.tokens.device)
        self._run.start(batch, ablated, rows & ~ablated, means)  # else: the rows left clean
        self._share = ablated.to(torch.float32).mean()

    def hooks(self) -> list[Hook]:
        return self._run.hooks()

    def reset(self) -> None:
        self._run.stop()
        self._share = None

    def loss(self, tokens: Tensor, attention_mask: Tensor | None = None
             ) -> tuple[Tensor, dict[str, Tensor]]:
        """No loss term of its own (it acts on the forward); logs the share ablated."""
        zero = torch.zeros((), device=tokens.device)
        share = zero if self._share is None else self._share
        self.reset()
        return zero, {f"{self.name}/ablated": share}


class PathAblatedMargin(Objective):
    """``weight x`` the mean hinge ``relu(delta + z_y - max_{j != y} z_j)`` of the model with
    ``edges`` ablated on every example of ``tasks``, over those examples' scored positions.

    Args:
        model: a headwise Transformer.
        edges: the edges the tasks must need (ablated together in the second forward).
        task_ids: task indices whose examples are scored.
        weight: the term's weight (0: no second forward).
        name: the lever's name.
        delta: the logit margin.
        mode: ``mean`` or ``zero``.
        pool: as ``StochasticPathAblation``'s; without it, ``mean`` puts in the senders'
            clean means over the batch's examples of ``tasks`` (a forward without gradient).
    """

    def __init__(self, model: nn.Module, edges: Iterable[Edge], task_ids: list[int],
                 weight: float = 0.0, name: str = "path-margin", delta: float = MARGIN_DELTA,
                 mode: str = "mean", pool: Callable[[int, int], Any] | None = None) -> None:
        self.edges = tuple(edges)
        self.task_ids = _check("PathAblatedMargin", self.edges, task_ids, mode)
        self.model, self.mode = model, mode
        self.weight, self.delta = float(weight), float(delta)
        self.name = name
        self._run = _PathRun(model, self.edges, mode)
        self._means = None if pool is None or mode == "zero" else _PoolMeans(model, pool, name)
        self._batch: Any = None

    def prepare(self, batch: Any, step: int = 0) -> None:
        self._batch = batch if self.weight > 0.0 else None  # no second forward at weight 0

    def hooks(self) -> list[Hook]:
        return []

    def reset(self) -> None:
        self._batch = None
        self._run.stop()

    def _clean_means(self, batch: Any, rows: Tensor) -> dict[Node, Tensor] | None:
        """Every sender's clean mean over ``rows`` (a forward without gradient; ``None`` for
        ``zero``, which needs none)."""
        if self.mode == "zero":
            return None
        if self._means is not None:
            return self._means(batch.tokens.device)
        return clean_means(self.model, batch, rows)

    def loss(self, tokens: Tensor, attention_mask: Tensor | None = None
             ) -> tuple[Tensor, dict[str, Tensor]]:
        """The weighted hinge; logs the edge-ablated accuracy on the scored positions."""
        batch, self._batch = self._batch, None
        if batch is None:
            zero = torch.zeros((), device=tokens.device)
            return zero, {f"{self.name}/ablated_accuracy": zero}
        rows = rows_of(batch.task_ids, self.task_ids)
        self._run.start(batch, rows, rows, self._clean_means(batch, rows))
        try:
            with self.model.hooks(*self._run.hooks()):  # type: ignore[operator]
                logits = self.model(batch.tokens, attention_mask=batch.attention_mask,
                                    task_ids=batch.task_ids)  # (B, T, V)
        finally:
            self._run.stop()
        hinge, right = margin_hinge(logits, batch.targets, rows, self.delta)
        return self.weight * hinge, {f"{self.name}/ablated_accuracy": right.detach()}
