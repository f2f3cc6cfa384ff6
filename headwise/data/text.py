"""TextTask: next-token language modelling on a local text file (bytes or a local tokenizer).

The file is read whole (``headwise.data.corpus``: bytes, or a ``tokenizer.json`` with its
truncation and padding off) and its documents (blank-line separated paragraphs, else lines)
are dealt whole to the ``"train"``, ``"eval"`` (the enforcement set) and ``"verify"`` (the
verification set) splits, ``eval_fraction`` of the ids held out in halves; so neither
held-out set shares text with training or with the other. An example is a window of
``seq_len + 1`` consecutive ids of one split (its documents joined in file order) at a
uniformly random start: ``tokens = w[:-1]``, ``targets = w[1:]`` (every position scored).
Text tasks do not use the synthetic tasks' special ids; mixing them with synthetic tasks needs
a model vocabulary covering both.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

import torch
from torch import Tensor

from headwise.data.batch import Batch
from headwise.data.corpus import check_split, read_corpus
from headwise.data.task import Task, check_int, make_batch
from headwise.errors import ConfigError


@dataclass(frozen=True, kw_only=True)
class TextTask(Task):
    """Language modelling over a local text file.

    Args:
        path: the text file (UTF-8).
        seq_len: T.
        tokenizer: ``None`` for bytes, or a directory holding ``tokenizer.json`` (or that file).
        split: ``"train"``, ``"eval"`` or ``"verify"``.
        eval_fraction: share of the ids held out (whole documents), split in halves for
            ``"eval"`` and ``"verify"``.

    Raises:
        ConfigError: a missing file or tokenizer, a bad split, or a split shorter than
            ``seq_len + 1`` ids.
    """

    name: ClassVar[str] = "text"
    starts_with_bos: ClassVar[bool] = False
    splits: ClassVar[tuple[str, ...]] = ("train", "eval", "verify")
    next_token: ClassVar[bool] = True
    path: str
    seq_len: int = 64
    tokenizer: str | None = None
    split: str = "train"
    eval_fraction: float = 0.1
    _ids: Tensor = field(init=False, repr=False, compare=False)
    _vocab: int = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        check_int(self.name, "seq_len", self.seq_len, 1)
        check_split(self.name, self.split, self.eval_fraction)
        corpus = read_corpus(self.path, self.tokenizer, self.name)
        part = corpus.split(self.split, self.eval_fraction)
        if len(part) < self.seq_len + 1:
            raise ConfigError(
                f"{self.name}.path: the {self.split!r} split of {self.path!r} has {len(part)} "
                f"ids, expected at least seq_len + 1 = {self.seq_len + 1} (documents are dealt "
                f"whole: {len(corpus.lengths)} in the file)")
        object.__setattr__(self, "_ids", part)
        object.__setattr__(self, "_vocab", corpus.vocab_size)

    @property
    def vocab_size(self) -> int:
        return self._vocab

    @property
    def n_ids(self) -> int:
        """Number of ids in this split."""
        return len(self._ids)

    @property
    def n_examples(self) -> int:
        """The consecutive windows of ``seq_len + 1`` ids that tile the split, each starting
        on the last id of the one before: every id after the first is a target once (a tail
        shorter than a window is left out)."""
        return (len(self._ids) - 1) // self.seq_len

    def examples_at(self, index: Tensor, generator: torch.Generator) -> Batch:
        """The tiling windows at ``index``."""
        starts = index * self.seq_len  # (k,)
        window = self._ids[starts[:, None] + torch.arange(self.seq_len + 1)]  # (k, T+1)
        return make_batch(window[:, :-1].contiguous(), window[:, 1:].contiguous())

    def sample(self, n: int, generator: torch.Generator) -> Batch:
        starts = torch.randint(0, len(self._ids) - self.seq_len, (n,), generator=generator)
        window = self._ids[starts[:, None] + torch.arange(self.seq_len + 1)]  # (n, T+1)
        return make_batch(window[:, :-1].contiguous(), window[:, 1:].contiguous())
