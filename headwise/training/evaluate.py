"""One forward pass with objectives attached, and held-out evaluation of task and objectives.

Objectives are duck-typed (``headwise.control`` defines them): ``obj.name``, ``obj.weight``,
``obj.hooks() -> list[Hook]`` (attached to the inner model during the forward) and
``obj.loss(tokens, attention_mask) -> (weighted scalar, {name: detached 0-d tensor})`` called
right after it.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import Tensor, nn

from headwise.control.objective import Objective, taking_part
from headwise.data import Batch, Mixture
from headwise.model.eval_mode import eval_mode
from headwise.training.distributed import DistContext
from headwise.training.metrics import ObjectiveSums, overall_loss, summarise, task_loss

# The evaluation generator is seeded with ``config.seed + EVAL_SEED_OFFSET``, so evaluation
# batches never coincide with training batches and are the same at every evaluation point.
EVAL_SEED_OFFSET = 1_000_003


def autocast(device: torch.device, enabled: bool) -> contextlib.AbstractContextManager[Any]:
    """bfloat16 autocast on ``device`` when enabled, else a null context."""
    if not enabled:
        return contextlib.nullcontext()
    return torch.autocast(device_type=device.type, dtype=torch.bfloat16)


def forward(model: Callable[..., Tensor], inner: nn.Module, batch: Batch,
            objectives: Sequence[Objective],
            bf16: bool, device: torch.device, hooks: Sequence[Any] | None = None,
            step: int = 0) -> tuple[Tensor, list[tuple[Tensor, dict[str, Any]]]]:
    """Logits (B, T, V) and each objective's ``(weighted loss, logs)`` for one batch.

    Args:
        model: what to call (the DDP wrapper, a compiled model, or the model itself).
        inner: the unwrapped model, whose hook points the objectives' hooks attach to.
        hooks: the hooks of the objectives taking part in this step (``taking_part``), made
            once by the caller (default: made here).
        step: the training step of the batch (``Objective.prepare``; 0 for evaluation).
    """
    live = {id(obj) for obj in taking_part(objectives)}  # an idle lever sits the step out
    try:
        for obj in objectives:  # per-batch levers (e.g. stochastic ablation by task) see it
            if id(obj) in live:
                obj.prepare(batch, step)
        if hooks is None:
            hooks = [h for obj in objectives if id(obj) in live for h in obj.hooks()]
        attached = (inner.hooks(*hooks) if hooks  # type: ignore[operator]
                    else contextlib.nullcontext())
        with autocast(device, bf16):
            with attached:
                logits = model(batch.tokens, attention_mask=batch.attention_mask,
                               task_ids=batch.task_ids)
            # Losses after the hooks are detached: a lever whose loss runs a forward of its own
            # (AblatedMargin) must not fire the other levers' hooks, which would overwrite what
            # they captured from this forward and leak their ablations into its forward.
            terms = []
            for obj in objectives:
                value, logs = (obj.loss(batch.tokens, batch.attention_mask)
                               if id(obj) in live else (0.0, {}))
                terms.append((torch.as_tensor(value, dtype=torch.float32, device=logits.device)
                              if not isinstance(value, Tensor) else value, logs))
        return logits, terms
    finally:  # the one reset of every lever's per-step state, whatever happened
        for obj in objectives:
            obj.reset()


@torch.no_grad()
def evaluate(model: nn.Module, data: Mixture, *, batch_size: int, n_batches: int, seed: int,
             objectives: Sequence[Objective] = (), bf16: bool = False,
             ctx: DistContext | None = None) -> dict[str, Any]:
    """Task loss and accuracy per task (and objective values) on held-out batches.

    Args:
        model: the unwrapped model (put in eval mode for the call, restored after).
        data: the mixture to draw from (``generator = Generator().manual_seed(seed)``).
        batch_size: global examples per batch (sharded over ranks when distributed).
        n_batches: batches to average over.
        seed: evaluation seed.
        objectives: objectives whose values to report.
        bf16: evaluate under bfloat16 autocast.
        ctx: the data-parallel context (statistics are summed over ranks).

    Returns:
        ``{"loss", "tasks": {name: {"loss", "accuracy", "exact", "examples"}},
        "objectives": {name: {"loss", "weight", "heads"}}}``.
    """
    ctx = ctx or DistContext()
    device = next(model.parameters()).device
    gen = torch.Generator().manual_seed(seed)
    stats = torch.zeros(len(data.names), 5, dtype=torch.float64, device=device)
    sums = ObjectiveSums(objectives, device)
    with eval_mode(model):
        for _ in range(n_batches):
            batch = ctx.shard(data.sample(batch_size, gen)).to(device)
            logits, terms = forward(model, model, batch, objectives, bf16, device)
            stats += task_loss(logits, batch, len(data.names))[1]
            sums.add(terms)
    stats = ctx.all_reduce_sum(stats)
    return {"loss": overall_loss(stats), "tasks": summarise(stats, data.names),
            "objectives": sums.record(ctx, n_batches)}
