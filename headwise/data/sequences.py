"""Sequence tasks: copy, reverse, sort (seq-to-seq after a separator) and induction.

Formats (ids as in ``headwise.data.batch``: ``BOS``=1, ``SEP``=2, symbol ``i`` is ``4 + i``):

- copy / reverse / sort, ``length`` n: ``[BOS, x_1..x_n, SEP, y_1..y_n]`` with ``y = x``,
  ``reversed(x)`` or ``sorted(x)`` (ascending ids); T = 2n + 2. Targets: at ``SEP`` predict
  ``y_1``, at ``y_i`` predict ``y_{i+1}``; nothing else is scored.
- induction (repeated random sequences): ``[BOS, s_0..s_{P-1}, s_0, s_1, ...]`` cut to ``seq_len``,
  with the period P drawn per example uniformly from ``period = (lo, hi)`` and the segment's
  symbols distinct when the vocabulary allows (else drawn with replacement). A random period
  prevents the positional shortcut a fixed offset allows; evaluate at unseen periods by giving
  another range. Targets: from the second occurrence of ``s_0`` on, each position predicts the
  next token (the first copy is unpredictable and unscored).
"""

from __future__ import annotations

from abc import abstractmethod
from dataclasses import dataclass
from typing import ClassVar

import torch
from torch import Tensor

from headwise.data.batch import BOS, CONTENT, IGNORE, SEP, Batch
from headwise.data.task import Task, check_int, check_vocab, make_batch, symbols
from headwise.errors import field_error


@dataclass(frozen=True, kw_only=True)
class _SeqToSeq(Task):
    """``[BOS, x, SEP, f(x)]`` with targets on the answer half."""

    input_format: ClassVar[str] = "[BOS, x, SEP, y]"
    vocab_size: int = 64
    length: int = 8

    def __post_init__(self) -> None:
        check_int(self.name, "length", self.length, 1)
        check_vocab(self.name, self.vocab_size, CONTENT + 1, "at least 1 symbol")

    @property
    def seq_len(self) -> int:
        return 2 * self.length + 2

    @abstractmethod
    def answer(self, x: Tensor) -> Tensor:
        """The answer (n, length) for inputs ``x`` (n, length)."""

    def sample(self, n: int, generator: torch.Generator) -> Batch:
        x = symbols(n, self.length, self.vocab_size - CONTENT, generator) + CONTENT  # (n, L)
        y = self.answer(x)
        col = torch.full((n, 1), BOS, dtype=torch.long)
        sep = torch.full((n, 1), SEP, dtype=torch.long)
        tokens = torch.cat([col, x, sep, y], dim=1)  # (n, 2L+2)
        targets = torch.full_like(tokens, IGNORE)
        targets[:, self.length + 1:-1] = y  # SEP predicts y_1, ..., y_{L-1} predicts y_L
        return make_batch(tokens, targets)


@dataclass(frozen=True, kw_only=True)
class CopyTask(_SeqToSeq):
    """Copy the input after the separator."""

    name: ClassVar[str] = "copy"

    def answer(self, x: Tensor) -> Tensor:
        return x.clone()


@dataclass(frozen=True, kw_only=True)
class ReverseTask(_SeqToSeq):
    """Write the input backwards after the separator."""

    name: ClassVar[str] = "reverse"

    def answer(self, x: Tensor) -> Tensor:
        return x.flip(1)


@dataclass(frozen=True, kw_only=True)
class SortTask(_SeqToSeq):
    """Write the input's symbols in ascending order after the separator."""

    name: ClassVar[str] = "sort"

    def answer(self, x: Tensor) -> Tensor:
        return x.sort(dim=1).values


@dataclass(frozen=True, kw_only=True)
class InductionTask(Task):
    """Periodic random sequences: a random segment repeated with a random period.

    Args:
        vocab_size: ids used (symbols are ``4..vocab_size-1``).
        seq_len: T, including the leading ``BOS``.
        period: inclusive range ``(lo, hi)`` of periods (an int means a fixed period).
        distinct: draw a segment's symbols without replacement when there are enough symbols.
    """

    name: ClassVar[str] = "induction"
    vocab_size: int = 64
    seq_len: int = 64
    period: tuple[int, int] = (8, 32)
    distinct: bool = True

    def __post_init__(self) -> None:
        period = self.period
        if isinstance(period, int) and not isinstance(period, bool):
            period = (period, period)
        if (not isinstance(period, (tuple, list)) or len(period) != 2
                or any(isinstance(p, bool) or not isinstance(p, int) for p in period)
                or not 1 <= period[0] <= period[1]):
            raise field_error(f"{self.name}.period", self.period,
                              "an integer or a range [lo, hi] of integers with 1 <= lo <= hi")
        object.__setattr__(self, "period", (int(period[0]), int(period[1])))
        check_int(self.name, "seq_len", self.seq_len, 1)
        if self.seq_len < period[1] + 3:
            raise field_error(f"{self.name}.seq_len", self.seq_len,
                              f"an integer >= {period[1] + 3} (BOS + the longest period "
                              f"{period[1]} + 2, so that every example has a target)")
        check_vocab(self.name, self.vocab_size, CONTENT + 1, "at least 1 symbol")
        if not isinstance(self.distinct, bool):
            raise field_error(f"{self.name}.distinct", self.distinct, "true or false")

    def sample(self, n: int, generator: torch.Generator) -> Batch:
        lo, hi = self.period
        n_sym = self.vocab_size - CONTENT
        L = self.seq_len - 1  # content length after BOS
        periods = torch.randint(lo, hi + 1, (n,), generator=generator)  # (n,)
        segment = symbols(n, hi, n_sym, generator, distinct=self.distinct and n_sym >= hi)
        pos = torch.arange(L)  # (L,)
        content = segment.gather(1, pos[None, :] % periods[:, None]) + CONTENT  # (n, L)
        tokens = torch.cat([torch.full((n, 1), BOS, dtype=torch.long), content], dim=1)
        targets = torch.full_like(tokens, IGNORE)
        # content index j >= P predicts content[j + 1]; token position t = j + 1.
        nxt = tokens[:, 2:]  # (n, L-1): the token after position t = 1..L-1
        scored = pos[None, :-1] >= periods[:, None]  # (n, L-1), j = t - 1 = 0..L-2
        targets[:, 1:-1] = torch.where(scored, nxt, torch.full_like(nxt, IGNORE))
        return make_batch(tokens, targets)
