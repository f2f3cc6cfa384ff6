"""Task: the interface every data generator follows, and shared validation helpers.

A task knows its vocabulary size (the ids it uses, see ``headwise.data.batch`` for the shared
layout), its sequence length, and how to draw ``n`` examples from a ``torch.Generator``.
Drawing is a pure function of the generator's state, so a seeded generator reproduces a batch
exactly (the trainer saves the generator's state in checkpoints for exact resume).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import ClassVar

import torch
from torch import Tensor

from headwise.data.batch import CONTENT, Batch
from headwise.errors import ConfigError, field_error


class Task(ABC):
    """A seeded generator of examples for one job (copy, sort, language modelling, ...).

    Subclasses are frozen dataclasses whose fields are the task's keyword arguments; they are
    registered by ``name`` in ``headwise.data.TASKS``.
    """

    name: ClassVar[str] = "task"
    # Tasks whose inputs look alike share a format: a model cannot tell them apart without a
    # task marker (``headwise.data.markers``). Default: a format of the task's own.
    input_format: ClassVar[str] = ""
    # Whether every sequence starts with ``BOS`` (a task marker goes right after it).
    starts_with_bos: ClassVar[bool] = True
    # Tasks read from a file hold disjoint parts of it, chosen by a ``split`` argument: the
    # training data, the enforcement set (``"eval"``) and the verification set (``"verify"``).
    # Generated tasks have none: their held-out sets are drawn from seeds of their own.
    splits: ClassVar[tuple[str, ...]] = ()
    # The circuit known to solve the task, as ``(role, layer)`` pairs counted from the bottom:
    # a head with that role in that layer (a previous-token head below an induction head for
    # retrieval). Enforcement adds these roles' objectives on heads the contract leaves free
    # when a floor on the task fails and stops improving (docs/contracts.md, "Circuit
    # assists"). Empty: the circuit is proposed from the task's training examples instead
    # (``headwise.data.circuit_proposals``), for built-in tasks and the user's files alike.
    circuit: ClassVar[tuple[tuple[str, int], ...]] = ()
    # Whether the targets are the next input tokens of free text (language modelling on a
    # file): a bidirectional model sees each answer at the next position, so such a task
    # needs ``causal=True`` (``check_causal``). The built-in generators are not refused:
    # on a bidirectional model they are studies of what reads the right neighbour.
    next_token: ClassVar[bool] = False
    # Whether the model needs BERT's masked-LM head for this task (``headwise.data.mlm``).
    needs_mlm_head: ClassVar[bool] = False

    @property
    @abstractmethod
    def vocab_size(self) -> int:
        """Number of token ids the task uses (ids lie in ``[0, vocab_size)``)."""

    @property
    @abstractmethod
    def seq_len(self) -> int:
        """Length T of every sequence the task draws."""

    @abstractmethod
    def sample(self, n: int, generator: torch.Generator) -> Batch:
        """Draw ``n`` examples.

        Args:
            n: number of examples (>= 0).
            generator: CPU generator; its state advances deterministically.

        Returns:
            A ``Batch`` of shape (n, seq_len) with ``task_ids`` all 0.
        """

    @property
    def n_examples(self) -> int | None:
        """How many distinct examples a file-backed task's split holds (its rows, or the
        windows that tile its text once); ``None`` for a generated task, whose draws never
        run out."""
        return None

    def examples_at(self, index: Tensor, generator: torch.Generator) -> Batch:
        """The examples of a file-backed task's split at ``index`` (k,), in that order
        (``0 <= index < n_examples``); ``generator`` draws what an example draws (a masked-LM
        task's masking).

        Raises:
            ConfigError: a generated task, which has no fixed set of examples.
        """
        raise ConfigError(f"{self.name}: a generated task has no fixed set of examples; "
                          "expected a task read from a file (text, pairs, mlm)")

    def every_example(self, generator: torch.Generator) -> Batch:
        """Every example of a file-backed task's split once, in file order (``split: all``:
        the whole file, new verification data for ``verify --data``).

        Raises:
            ConfigError: a generated task, which has no fixed set of examples.
        """
        n = self.n_examples
        return self.examples_at(torch.arange(0 if n is None else n), generator)

    def held_out(self, n: int, generator: torch.Generator) -> Batch:
        """``n`` examples for a held-out set (the enforcement or the verification set).

        A generated task draws them independently (``sample``): each is a fresh draw from the
        task's distribution. A file-backed task takes ``n`` of its split's examples at random
        *without replacement*, or every one (in a random order) when the split holds fewer:
        the bounds a verdict states treat a set's examples as independent, and the same row
        (or overlapping windows of a text) counted twice would be evidence the file does not
        hold.
        """
        total = self.n_examples
        if total is None:
            return self.sample(n, generator)
        pick = torch.randperm(total, generator=generator)[:n]
        return self.examples_at(pick, generator)


def check_causal(task: Task, causal: bool, path: str) -> None:
    """Refuse a next-token task (``Task.next_token``) on a bidirectional model.

    Args:
        task: the task.
        causal: the model's ``causal`` setting.
        path: the task's place in the spec (``data.tasks.lm``).

    Raises:
        ConfigError: ``<path>.task: 'text' is next-token prediction, which model.causal=false
            sees the answer of; expected task: mlm``.
    """
    if task.next_token and not causal:
        raise ConfigError(f"{path}.task: {task.name!r} is next-token prediction, which "
                          "model.causal=false sees the answer of; expected task: mlm (or a "
                          "causal model)")


def check_int(task: str, field: str, value: object, minimum: int) -> int:
    """Return ``value`` if it is an int >= ``minimum``.

    Raises:
        ConfigError: ``<task>.<field>: got <value>, expected an integer >= <minimum>``.
    """
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise field_error(f"{task}.{field}", value, f"an integer >= {minimum}")
    return value


def check_vocab(task: str, vocab_size: object, needed: int, why: str) -> None:
    """Check that ``vocab_size`` holds the special ids plus the task's symbols.

    Raises:
        ConfigError: naming the task, the value, the minimum and the reason.
    """
    check_int(task, "vocab_size", vocab_size, 1)
    assert isinstance(vocab_size, int)
    if vocab_size < needed:
        raise field_error(f"{task}.vocab_size", vocab_size,
                          f"an integer >= {needed} ({CONTENT} special ids + {why})")


def symbols(n: int, length: int, n_symbols: int, generator: torch.Generator,
            distinct: bool = False) -> Tensor:
    """Random symbol indices (n, length) in ``[0, n_symbols)``.

    Args:
        distinct: draw without replacement within each row (needs ``length <= n_symbols``).
    """
    if distinct:
        return torch.rand(n, n_symbols, generator=generator).argsort(dim=1)[:, :length]
    return torch.randint(0, n_symbols, (n, length), generator=generator)


def make_batch(tokens: Tensor, targets: Tensor) -> Batch:
    """A single-task batch without padding (task ids 0)."""
    return Batch(tokens, targets, None, torch.zeros(tokens.shape[0], dtype=torch.long))
