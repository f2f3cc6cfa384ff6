"""Task loss with per-task statistics, metric summaries, ``metrics.jsonl`` and the progress bar.

Task loss: cross-entropy at target positions only (``targets != -100``), averaged over each
example's target positions and then over examples, so every example weighs the same whatever
its number of targets (mixture weights thus set each task's share of the gradient).
Accuracy is token-level (argmax equals target, over target positions); ``exact`` is the share
of examples whose every target is right.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from headwise.data import IGNORE, Batch
from headwise.errors import StorageError
from headwise.training.safetensors_io import write_bytes_atomic

# Columns of the per-task statistics matrix (n_tasks, 5).
LOSS_SUM, CORRECT, TARGETS, EXACT, EXAMPLES = range(5)


def task_loss(logits: Tensor, batch: Batch, n_tasks: int) -> tuple[Tensor, Tensor]:
    """Mean per-example cross-entropy and per-task sums.

    Args:
        logits: (B, T, V) model output.
        batch: the batch (targets (B, T), task_ids (B,)).
        n_tasks: number of tasks (rows of the statistics).

    Returns:
        ``(loss, stats)``: scalar loss with gradient, and a float64 (n_tasks, 5) matrix of
        summed per-example loss, correct tokens, target tokens, exact examples and examples,
        on the logits' device (no host synchronisation per step).
    """
    logits = logits.float()
    targets = batch.targets
    valid = targets != IGNORE  # (B, T)
    ce = F.cross_entropy(logits.transpose(1, 2), targets, ignore_index=IGNORE,
                         reduction="none")  # (B, T), 0 where ignored
    count = valid.sum(1)  # (B,)
    per_example = ce.sum(1) / count.clamp(min=1)  # (B,)
    loss = per_example.mean()
    with torch.no_grad():
        correct = ((logits.argmax(-1) == targets) & valid).sum(1)  # (B,)
        exact = (correct == count) & (count > 0)
        cols = torch.stack([per_example.detach().double(), correct.double(), count.double(),
                            exact.double(), torch.ones_like(count, dtype=torch.float64)], 1)
        stats = torch.zeros(n_tasks, 5, dtype=torch.float64, device=logits.device)
        stats.index_add_(0, batch.task_ids, cols)
    return loss, stats


def summarise(stats: Tensor, names: list[str]) -> dict[str, Any]:
    """Per-task ``loss``, ``accuracy``, ``exact`` and ``examples`` from summed statistics."""
    out: dict[str, Any] = {}
    for i, name in enumerate(names):
        row = stats[i].tolist()
        if row[EXAMPLES] == 0:
            continue
        out[name] = {"loss": row[LOSS_SUM] / row[EXAMPLES],
                     "accuracy": row[CORRECT] / max(row[TARGETS], 1.0),
                     "exact": row[EXACT] / row[EXAMPLES], "examples": int(row[EXAMPLES])}
    return out


def overall_loss(stats: Tensor) -> float:
    """Mean per-example loss over all tasks."""
    return float(stats[:, LOSS_SUM].sum() / stats[:, EXAMPLES].sum().clamp(min=1))


class MetricsWriter:
    """Appends one JSON object per line to ``metrics.jsonl`` (rank 0 only; else a no-op)."""

    def __init__(self, out_dir: Path | None, enabled: bool) -> None:
        self.path = Path(out_dir) / "metrics.jsonl" if out_dir is not None and enabled else None

    def truncate_after(self, step: int) -> None:
        """Drop lines logged after ``step`` (a resumed run rewrites them)."""
        if self.path is None or not self.path.is_file():
            return
        keep = []
        for line in self.path.read_text().splitlines():
            try:
                if json.loads(line).get("step", 0) <= step:
                    keep.append(line)
            except json.JSONDecodeError:  # a line cut short by a kill
                continue
        write_bytes_atomic(self.path, "".join(f"{line}\n" for line in keep).encode())

    def write(self, record: dict[str, Any]) -> None:
        """Append ``record`` as one line and flush."""
        if self.path is None:
            return
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            with open(self.path, "a") as f:
                f.write(json.dumps(record) + "\n")
        except OSError as e:  # a line cut short is dropped on resume (truncate_after)
            raise StorageError(f"{self.path}: cannot write ({e.strerror or e})") from None


class ProgressBar:
    """A rich progress bar with the loss and per-task accuracy (no-op when disabled)."""

    def __init__(self, total: int, start: int, enabled: bool) -> None:
        self._progress = None
        if not enabled:
            return
        from rich.progress import (
            BarColumn,
            MofNCompleteColumn,
            Progress,
            TextColumn,
            TimeElapsedColumn,
            TimeRemainingColumn,
        )

        self._progress = Progress(TextColumn("train"), BarColumn(), MofNCompleteColumn(),
                                  TimeElapsedColumn(), TimeRemainingColumn(),
                                  TextColumn("{task.fields[info]}"))
        self._progress.start()
        self._task = self._progress.add_task("train", total=total, completed=start, info="")

    def update(self, step: int, loss: float | None = None,
               tasks: dict[str, Any] | None = None) -> None:
        """Move to ``step``; show ``loss`` and each task's accuracy when given."""
        if self._progress is None:
            return
        if loss is None:
            self._progress.update(self._task, completed=step)
            return
        accs = " ".join(f"{n} {v['accuracy']:.2f}" for n, v in (tasks or {}).items())
        self._progress.update(self._task, completed=step, info=f"loss {loss:.4f} | acc {accs}")

    def close(self) -> None:
        """Stop drawing."""
        if self._progress is not None:
            self._progress.stop()
