"""Task markers: one token per task, right after ``BOS``, so a model can tell tasks apart.

Copy, reverse and sort all read ``[BOS, x, SEP, y]``; mixed without task gates, a model cannot
know at ``SEP`` which answer to write (a 3-task 2-layer model stalls near 0.78 accuracy,
docs/benchmarks.md). With markers, task ``i``'s examples read ``[BOS, MARK_i, x, SEP, y]``.
Marker ids are the top ``n_tasks`` ids of the model's vocabulary (``marker_ids``), so the
tasks' own symbols stay below them. ``data.task_tokens: auto`` (the default) turns markers on
when two tasks share an input format (``Task.input_format``) and the spec has no task gates (which
already tell the model its task).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from headwise.data.batch import IGNORE, Batch
from headwise.data.task import Task

CHOICES = ("auto", "on", "off")


def shares_format(tasks: Sequence[Task] | Sequence[type[Task]]) -> bool:
    """Whether two of the tasks share an input format (then ``auto`` turns markers on)."""
    keys = [t.input_format or t.name for t in tasks]
    return len(set(keys)) < len(keys)


def use_markers(choice: str, tasks: Sequence[Task] | Sequence[type[Task]]) -> bool:
    """Resolve ``data.task_tokens`` (``auto``, ``on`` or ``off``) for these tasks."""
    if choice not in CHOICES:
        raise ValueError(f"task_tokens: got {choice!r}, expected one of {list(CHOICES)}")
    return choice == "on" or (choice == "auto" and shares_format(tasks))


def marker_ids(vocab_size: int, n_tasks: int) -> list[int]:
    """The marker id of each task: the top ``n_tasks`` ids of a ``vocab_size`` vocabulary."""
    return [vocab_size - n_tasks + i for i in range(n_tasks)]


def insert_marker(batch: Batch, marker: int, after_bos: bool = True) -> Batch:
    """The batch with ``marker`` inserted at position 1 (after ``BOS``) or 0: (B, T + 1).

    Targets shift with their tokens (the marker takes over what ``BOS`` predicted); the first
    position predicts nothing, since the marker is given, not predicted.
    """
    at = 1 if after_bos else 0
    B = batch.tokens.shape[0]
    mark = torch.full((B, 1), marker, dtype=batch.tokens.dtype)
    none = torch.full((B, 1), IGNORE, dtype=batch.targets.dtype)
    tokens = torch.cat([batch.tokens[:, :at], mark, batch.tokens[:, at:]], dim=1)
    # Position k of the old batch is k + 1 here; what sits before it now predicts nothing.
    targets = torch.cat([none, batch.targets], dim=1)
    mask = batch.attention_mask
    if mask is not None:
        mask = torch.cat([mask[:, :at], torch.ones_like(mask[:, :1]), mask[:, at:]], dim=1)
    return Batch(tokens, targets, mask, batch.task_ids)
