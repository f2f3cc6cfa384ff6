"""Algorithmic tasks: modular addition, balanced-bracket depth and key-value retrieval.

Formats (ids as in ``headwise.data.batch``: ``BOS``=1, ``SEP``=2, ``QUERY``=3, symbol ``i`` is
``4 + i``):

- modular_addition, ``modulus`` p: ``[BOS, a, QUERY, b, SEP]`` (``QUERY`` plays ``+``, ``SEP``
  plays ``=``); the target at ``SEP`` is ``(a + b) mod p``. Numbers are symbols ``0..p-1``.
- bracket_depth, ``n_pairs`` n: ``[BOS, c_1..c_2n]``, a balanced bracket string (``(`` is symbol
  0, ``)`` symbol 1); the target at ``c_i`` is the nesting depth after ``c_i`` as symbol
  ``2 + depth``. Strings are drawn left to right: open or close with probability 1/2 unless the
  depth is 0 (must open), equals the brackets left (must close) or ``max_depth`` (must close).
- kv_retrieval, ``n_pairs`` n: ``[BOS, k_1, v_1, ..., k_n, v_n, QUERY, k_q]`` with distinct keys
  (symbols ``0..n_keys-1``) and values (symbols ``n_keys..n_keys+n_values-1``, with
  replacement); ``k_q`` is one of the keys and the target at it is its value.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch

from headwise.data.batch import BOS, CONTENT, IGNORE, QUERY, SEP, Batch
from headwise.data.task import Task, check_int, check_vocab, make_batch, symbols
from headwise.errors import field_error


@dataclass(frozen=True, kw_only=True)
class ModularAdditionTask(Task):
    """``a + b = (a + b) mod modulus``."""

    name: ClassVar[str] = "modular_addition"
    vocab_size: int = 64
    modulus: int = 13

    def __post_init__(self) -> None:
        check_int(self.name, "modulus", self.modulus, 2)
        check_vocab(self.name, self.vocab_size, CONTENT + self.modulus,
                    f"modulus={self.modulus} numbers")

    @property
    def seq_len(self) -> int:
        return 5

    def sample(self, n: int, generator: torch.Generator) -> Batch:
        ab = torch.randint(0, self.modulus, (n, 2), generator=generator)  # (n, 2)
        c = ab.sum(1) % self.modulus
        col = torch.full((n,), 0, dtype=torch.long)
        tokens = torch.stack([col + BOS, ab[:, 0] + CONTENT, col + QUERY, ab[:, 1] + CONTENT,
                              col + SEP], dim=1)  # (n, 5)
        targets = torch.full_like(tokens, IGNORE)
        targets[:, -1] = c + CONTENT
        return make_batch(tokens, targets)


@dataclass(frozen=True, kw_only=True)
class BracketDepthTask(Task):
    """Balanced brackets; predict the nesting depth after each bracket."""

    name: ClassVar[str] = "bracket_depth"
    vocab_size: int = 64
    n_pairs: int = 8
    max_depth: int | None = None

    def __post_init__(self) -> None:
        check_int(self.name, "n_pairs", self.n_pairs, 1)
        if self.max_depth is None:
            object.__setattr__(self, "max_depth", self.n_pairs)
        check_int(self.name, "max_depth", self.max_depth, 1)
        assert self.max_depth is not None
        check_vocab(self.name, self.vocab_size, CONTENT + 3 + self.max_depth,
                    f"2 brackets and depths 0..{self.max_depth}")

    @property
    def seq_len(self) -> int:
        return 2 * self.n_pairs + 1

    def sample(self, n: int, generator: torch.Generator) -> Batch:
        assert self.max_depth is not None
        steps = 2 * self.n_pairs
        coin = torch.rand(n, steps, generator=generator) < 0.5  # (n, 2n) open if free
        depth = torch.zeros(n, dtype=torch.long)
        brackets, depths = [], []
        for i in range(steps):
            left = steps - i
            must_close = (depth >= left) | (depth >= self.max_depth)
            opens = (depth == 0) | (coin[:, i] & ~must_close)
            depth = depth + torch.where(opens, 1, -1)
            brackets.append(torch.where(opens, 0, 1))
            depths.append(depth)
        tokens = torch.cat([torch.full((n, 1), BOS, dtype=torch.long),
                            torch.stack(brackets, 1) + CONTENT], dim=1)  # (n, 2n+1)
        targets = torch.full_like(tokens, IGNORE)
        targets[:, 1:] = torch.stack(depths, 1) + CONTENT + 2
        return make_batch(tokens, targets)


@dataclass(frozen=True, kw_only=True)
class KVRetrievalTask(Task):
    """Key-value pairs in context, then a query key; predict its value."""

    name: ClassVar[str] = "kv_retrieval"
    circuit: ClassVar[tuple[tuple[str, int], ...]] = (("previous_token", 0), ("induction", 1))
    vocab_size: int = 64
    n_pairs: int = 4
    n_keys: int = 16
    n_values: int = 16

    def __post_init__(self) -> None:
        check_int(self.name, "n_pairs", self.n_pairs, 1)
        check_int(self.name, "n_keys", self.n_keys, 1)
        check_int(self.name, "n_values", self.n_values, 1)
        if self.n_keys < self.n_pairs:
            raise field_error(f"{self.name}.n_keys", self.n_keys,
                              f"an integer >= n_pairs={self.n_pairs} (keys are distinct)")
        check_vocab(self.name, self.vocab_size, CONTENT + self.n_keys + self.n_values,
                    f"n_keys={self.n_keys} + n_values={self.n_values} symbols")

    @property
    def seq_len(self) -> int:
        return 2 * self.n_pairs + 3

    def sample(self, n: int, generator: torch.Generator) -> Batch:
        keys = symbols(n, self.n_pairs, self.n_keys, generator, distinct=True)  # (n, P)
        values = symbols(n, self.n_pairs, self.n_values, generator) + self.n_keys  # (n, P)
        which = torch.randint(0, self.n_pairs, (n, 1), generator=generator)  # (n, 1)
        pairs = torch.stack([keys, values], dim=2).reshape(n, 2 * self.n_pairs) + CONTENT
        col = torch.full((n, 1), 0, dtype=torch.long)
        tokens = torch.cat([col + BOS, pairs, col + QUERY, keys.gather(1, which) + CONTENT],
                           dim=1)  # (n, 2P+3)
        targets = torch.full_like(tokens, IGNORE)
        targets[:, -1:] = values.gather(1, which) + CONTENT
        return make_batch(tokens, targets)
