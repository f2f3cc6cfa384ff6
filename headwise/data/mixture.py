"""Mixture: several tasks sampled into one batch by weight, each example tagged with its task id.

Each example's task is drawn independently (``torch.multinomial`` with the normalised weights),
then every task draws its examples, in the order of ``mixture.names``, from the same generator;
so a batch is a pure function of the generator state. Sequences shorter than the longest task's
are right-padded with ``PAD`` (``attention_mask`` 0, targets ignored). With ``markers`` each
example carries its task's marker token after ``BOS`` (``headwise.data.markers``).
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import torch
from torch import Tensor

from headwise.data.batch import IGNORE, PAD, Batch
from headwise.data.markers import insert_marker
from headwise.data.task import Task, check_causal
from headwise.errors import ConfigError, field_error


class Mixture:
    """A weighted mixture of named tasks.

    Args:
        tasks: name -> task; the order fixes the task ids (``names[i]`` has id ``i``).
        weights: name -> positive weight (normalised); ``None`` for equal weights.
        markers: task name -> marker token id inserted after each example's ``BOS``
            (``headwise.data.markers``); ``None``: no markers.

    Raises:
        ConfigError: no tasks, a weight for an unknown task, a missing or non-positive weight,
            markers that do not name every task once.
    """

    def __init__(self, tasks: Mapping[str, Task], weights: Mapping[str, float] | None = None,
                 markers: Mapping[str, int] | None = None) -> None:
        if not tasks:
            raise ConfigError("data.tasks: got no tasks, expected at least one")
        for name, task in tasks.items():
            if not isinstance(task, Task):
                raise field_error(f"data.tasks.{name}", task, "a headwise.data.Task")
        weights = dict.fromkeys(tasks, 1.0) if weights is None else dict(weights)
        unknown = sorted(set(weights) - set(tasks))
        if unknown:
            raise ConfigError(f"data.weights.{unknown[0]}: not a task of the mixture, "
                              f"expected one of {list(tasks)}")
        for name in tasks:
            if name not in weights:
                raise ConfigError(f"data.weights.{name}: missing, expected a positive weight "
                                  f"for every task")
            w = weights[name]
            if isinstance(w, bool) or not isinstance(w, (int, float)) or not (
                    w > 0 and math.isfinite(w)):
                raise field_error(f"data.weights.{name}", w, "a positive finite number")
        if markers is not None and set(markers) != set(tasks):
            raise ConfigError(f"markers: got tasks {sorted(markers)}, expected one marker for "
                              f"each task of {sorted(tasks)}")
        self.markers: dict[str, int] | None = None if markers is None else dict(markers)
        self.tasks: dict[str, Task] = dict(tasks)
        self.names: list[str] = list(tasks)
        total = sum(float(weights[n]) for n in self.names)
        self.weights: dict[str, float] = {n: float(weights[n]) / total for n in self.names}

    @property
    def seq_len(self) -> int:
        """T of every batch: the longest task's sequence length (+1 for a task marker)."""
        return max(t.seq_len for t in self.tasks.values()) + (self.markers is not None)

    @property
    def vocab_size(self) -> int:
        """The smallest model vocabulary that holds every task's ids."""
        return max(t.vocab_size for t in self.tasks.values())

    def check_model(self, vocab_size: int, max_seq_len: int | None = None,
                    causal: bool = True) -> None:
        """Check that a model with this vocabulary (and context length, and attention
        direction) can take every task.

        Raises:
            ConfigError: naming the task whose vocabulary or length does not fit, or a
                next-token task on a bidirectional model (``check_causal``).
        """
        extra = self.markers is not None
        top = max(self.markers.values()) + 1 if self.markers else 0
        if top > vocab_size:
            raise ConfigError(f"markers: id {top - 1} needs vocab_size >= {top}, the model has "
                              f"{vocab_size}")
        for name, task in self.tasks.items():
            check_causal(task, causal, f"data.tasks.{name}")
            limit = min(self.markers.values()) if self.markers else vocab_size
            if task.vocab_size > limit:
                raise ConfigError(f"data.tasks.{name}.vocab_size: got {task.vocab_size}, "
                                  f"expected at most {limit} (the model's vocab_size="
                                  f"{vocab_size}{', less the task markers' if extra else ''})")
            if max_seq_len is not None and task.seq_len + extra > max_seq_len:
                raise ConfigError(f"data.tasks.{name}: sequence length {task.seq_len + extra}"
                                  f"{' (with its task marker)' if extra else ''} exceeds the "
                                  f"model's max_seq_len={max_seq_len}")

    def sample(self, batch_size: int, generator: torch.Generator,
               held_out: bool = False) -> Batch:
        """Draw a batch of ``batch_size`` examples (B, T) with ``task_ids`` set.

        Args:
            batch_size: B (>= 1).
            generator: CPU generator; its state advances deterministically.
            held_out: draw a held-out set (``Task.held_out``): a file-backed task's examples
                without replacement, so a task whose split holds fewer examples than its
                share of ``batch_size`` gives each of them once and the batch is that much
                smaller.
        """
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
            raise field_error("batch_size", batch_size, "an integer >= 1")
        probs = torch.tensor([self.weights[n] for n in self.names], dtype=torch.float64)
        choice = torch.multinomial(probs, batch_size, replacement=True, generator=generator)
        if held_out:
            keep = torch.ones_like(choice, dtype=torch.bool)
            for i, name in enumerate(self.names):
                total = self.tasks[name].n_examples
                if total is not None:
                    keep[(choice == i).nonzero().flatten()[total:]] = False
            choice = choice[keep]
        return self._fill(choice, generator, held_out)

    def sample_task(self, name: str, batch_size: int, generator: torch.Generator) -> Batch:
        """Draw ``batch_size`` examples of the task ``name`` alone, laid out as ``sample`` lays
        out that task's rows (its marker, its task id, padding to ``seq_len``).

        Raises:
            ConfigError: an unknown task or a bad ``batch_size``.
        """
        if name not in self.names:
            raise field_error("task", name, f"one of {list(self.names)}")
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
            raise field_error("batch_size", batch_size, "an integer >= 1")
        return self._fill(torch.full((batch_size,), self.names.index(name)), generator)

    def _fill(self, choice: Tensor, generator: torch.Generator, held_out: bool = False
              ) -> Batch:
        """The batch whose row ``b`` is an example of task ``choice[b]`` (B,), drawn by
        ``Task.held_out`` where ``held_out`` (else ``Task.sample``)."""
        batch_size, T = int(choice.shape[0]), self.seq_len
        tokens = torch.full((batch_size, T), PAD, dtype=torch.long)
        targets = torch.full((batch_size, T), IGNORE, dtype=torch.long)
        mask = torch.zeros((batch_size, T), dtype=torch.long)
        for i, name in enumerate(self.names):
            rows = (choice == i).nonzero().flatten()
            if rows.numel() == 0:
                continue
            task = self.tasks[name]
            draw = task.held_out if held_out else task.sample
            part = draw(int(rows.numel()), generator)
            if self.markers is not None:
                part = insert_marker(part, self.markers[name], task.starts_with_bos)
            t = part.tokens.shape[1]
            tokens[rows, :t] = part.tokens
            targets[rows, :t] = part.targets
            mask[rows, :t] = 1 if part.attention_mask is None else part.attention_mask
        padded = bool((mask == 0).any())
        return Batch(tokens, targets, mask if padded else None, choice.long())

    def __repr__(self) -> str:
        parts = ", ".join(f"{n}: {self.weights[n]:.3g}" for n in self.names)
        return f"Mixture({parts})"
