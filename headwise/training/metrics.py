"""Task loss with per-task statistics, running sums between log lines, and ``metrics.jsonl``.

Task loss: cross-entropy at target positions only (``targets != -100``), averaged over each
example's target positions and then over examples, so every example weighs the same whatever
its number of targets (mixture weights thus set each task's share of the gradient).
Accuracy is token-level (argmax equals target, over target positions); ``exact`` is the share
of examples whose every target is right.
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from headwise.atomic import write_bytes_atomic
from headwise.data import IGNORE, Batch
from headwise.errors import CheckpointError, StorageError
from headwise.training.distributed import DistContext

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


class ObjectiveSums:
    """Running sums of each objective's weighted term and logged values, kept on the device.

    ``add`` costs a few tensor ops per objective and never synchronises with the host; the
    values are read (and averaged over ranks) only by ``record``, once per log step. Log keys
    are fixed by the first call; a later call with other keys extends them.
    """

    def __init__(self, objectives: Sequence[Any], device: torch.device) -> None:
        self.objectives = list(objectives)
        self.device = device
        self.totals = torch.zeros(len(self.objectives), dtype=torch.float64, device=device)
        self.names: list[list[str]] = [[] for _ in self.objectives]
        self.values: list[Tensor | None] = [None for _ in self.objectives]

    def add(self, terms: Sequence[tuple[Tensor, dict[str, Any]]]) -> None:
        """Add one call's ``(weighted loss, logs)`` per objective."""
        if not terms:
            return
        self.totals += torch.stack([t.detach().reshape(()) for t, _ in terms]).double()
        for i, (_, log) in enumerate(terms):
            if not log:
                continue
            keys = list(log)
            if keys != self.names[i]:
                self._extend(i, keys)
            current = self.values[i]
            assert current is not None
            vals = list(log.values())
            if keys == self.names[i]:
                current += (torch.stack(vals) if isinstance(vals[0], Tensor)
                            else torch.tensor(vals)).to(current)
            else:  # a subset or a reordering of the known keys: the rare slow path
                pos = {k: j for j, k in enumerate(self.names[i])}
                for k, v in log.items():
                    current[pos[k]] += torch.as_tensor(v).to(current)

    def _extend(self, i: int, keys: list[str]) -> None:
        new = [k for k in keys if k not in set(self.names[i])]
        grown = torch.zeros(len(self.names[i]) + len(new), dtype=torch.float64,
                            device=self.device)
        old = self.values[i]
        if old is not None:
            grown[: old.numel()] = old
        self.names[i] = self.names[i] + new
        self.values[i] = grown

    def state(self) -> tuple[dict[str, Tensor], list[list[str]]]:
        """The sums as tensors and the log names, for a checkpoint of the logging window."""
        tensors = {"totals": self.totals}
        tensors.update({f"values.{i}": v for i, v in enumerate(self.values) if v is not None})
        return tensors, [list(n) for n in self.names]

    def load(self, tensors: dict[str, Tensor], names: list[list[str]]) -> None:
        """Restore what ``state`` returned (the same objectives, in the same order)."""
        self.totals = tensors["totals"].to(self.device, torch.float64)
        self.names = [list(n) for n in names]
        self.values = [tensors[f"values.{i}"].to(self.device, torch.float64)
                       if f"values.{i}" in tensors else None for i in range(len(names))]

    def record(self, ctx: DistContext, n: int) -> dict[str, Any]:
        """``{name: {"loss", "weight", "heads"}}``: means over ``n`` calls, averaged over ranks.

        Every rank calls this (one all-reduce when distributed; key order is the objectives'
        own, the same on every rank).
        """
        parts = [self.totals] + [v for v in self.values if v is not None]
        flat = torch.cat(parts) if len(parts) > 1 else self.totals
        if ctx.enabled:
            flat = ctx.all_reduce_sum(flat) / ctx.world_size
        host = (flat / max(n, 1)).tolist()  # the one host read
        out, pos = {}, len(self.objectives)
        for i, obj in enumerate(self.objectives):
            heads = {}
            if self.values[i] is not None:
                heads = dict(zip(self.names[i], host[pos:pos + len(self.names[i])],
                                 strict=True))
                pos += len(self.names[i])
            out[obj.name] = {"loss": host[i], "weight": float(obj.weight), "heads": heads}
        return out


@dataclass
class LogWindow:
    """The sums since the last ``"train"`` line, on the device: read only at log points.

    Attributes:
        stats: (n_tasks, 5) float64 per-task statistics (``task_loss``).
        loss_sum: float64 sum of the steps' total losses.
        sums: the objectives' running sums.
        steps: steps added since the last line.
    """

    stats: Tensor
    loss_sum: Tensor
    sums: ObjectiveSums
    steps: int = 0

    @classmethod
    def empty(cls, objectives: Sequence[Any], n_tasks: int, device: torch.device) -> LogWindow:
        """A window with nothing added yet."""
        return cls(torch.zeros(n_tasks, 5, dtype=torch.float64, device=device),
                   torch.zeros((), dtype=torch.float64, device=device),
                   ObjectiveSums(objectives, device))

    def add(self, stats: Tensor, total: Tensor,
            terms: Sequence[tuple[Tensor, dict[str, Any]]]) -> None:
        """Add one step: its task statistics, total loss and objective terms (no host read)."""
        self.stats += stats
        self.loss_sum += total.detach().double()
        self.sums.add(terms)
        self.steps += 1

    def record(self, ctx: DistContext, step: int, lr: float, names: list[str],
               grad_norm: Tensor | None, t0: float) -> dict[str, Any]:
        """The ``"train"`` metrics line, summed over ranks (every rank calls this)."""
        stats = ctx.all_reduce_sum(self.stats)
        loss = float(ctx.all_reduce_sum(self.loss_sum))
        record: dict[str, Any] = {
            "kind": "train", "step": step, "lr": lr,
            "loss": loss / ctx.world_size / max(self.steps, 1),
            "task_loss": overall_loss(stats), "tasks": summarise(stats, names),
            "objectives": self.sums.record(ctx, self.steps),
            "elapsed_s": time.perf_counter() - t0}
        if grad_norm is not None:
            record["grad_norm"] = float(grad_norm)
        return record


class MetricsWriter:
    """Appends one JSON object per line to ``metrics.jsonl`` (rank 0 only; else a no-op)."""

    def __init__(self, out_dir: Path | None, enabled: bool) -> None:
        self.path = Path(out_dir) / "metrics.jsonl" if out_dir is not None and enabled else None

    def truncate_after(self, step: int) -> None:
        """Drop lines logged after ``step`` (a resumed run rewrites them).

        A line cut short by a kill is dropped too; a line that is JSON but not an object, or
        bytes that are not UTF-8, were not written by the run and are refused.

        Raises:
            CheckpointError: naming the file and the line.
        """
        if self.path is None or not self.path.is_file():
            return
        data = self.path.read_bytes()
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError as e:
            raise CheckpointError(f"{self.path}: byte {e.start} is not UTF-8; expected the "
                                  "metrics this run wrote (one JSON object per line)") from None
        keep = []
        for number, line in enumerate(text.split("\n"), 1):
            try:
                record = json.loads(line)
            except ValueError:  # a line cut short by a kill (or the empty last one)
                continue
            if not isinstance(record, dict) or type(record.get("step", 0)) is not int:
                raise CheckpointError(f"{self.path}: line {number} is not a metrics record "
                                      "with an integer step; expected the metrics this run "
                                      "wrote (one JSON object per line)")
            if record.get("step", 0) <= step:
                keep.append(line)
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
