"""TextTask: next-token language modelling on a local text file (bytes or a local tokenizer).

The file is read once and encoded either as UTF-8 bytes (vocabulary 256, ids = byte values) or
with a HuggingFace ``tokenizers`` ``tokenizer.json`` from a local path (never downloaded). The
first ``1 - eval_fraction`` of the ids form the ``"train"`` split and the rest the ``"eval"``
split, so held-out evaluation never sees training text. An example is a window of
``seq_len + 1`` consecutive ids at a uniformly random start: ``tokens = w[:-1]``,
``targets = w[1:]`` (every position scored). Text tasks do not use the synthetic tasks' special
ids; mixing them with synthetic tasks needs a model vocabulary covering both.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar

import torch
from torch import Tensor

from headwise.data.batch import Batch
from headwise.data.task import Task, check_int, make_batch
from headwise.errors import ConfigError, field_error
from headwise.memory import check_memory

MAX_BYTES = 8 << 30  # corpora beyond a few GiB belong in a streaming pipeline, not in memory
BYTES_PER_CHAR = 16  # peak memory per byte of text while encoding (str, bytes, int64 ids)


@dataclass(frozen=True, kw_only=True)
class TextTask(Task):
    """Language modelling over a local text file.

    Args:
        path: the text file (UTF-8).
        seq_len: T.
        tokenizer: ``None`` for bytes, or a directory holding ``tokenizer.json`` (or that file).
        split: ``"train"`` or ``"eval"``.
        eval_fraction: share of the ids (at the end of the file) held out for ``"eval"``.

    Raises:
        ConfigError: a missing file or tokenizer, a bad split, or a split shorter than
            ``seq_len + 1`` ids.
    """

    name: ClassVar[str] = "text"
    starts_with_bos: ClassVar[bool] = False
    path: str
    seq_len: int = 64
    tokenizer: str | None = None
    split: str = "train"
    eval_fraction: float = 0.1
    _ids: Tensor = field(init=False, repr=False, compare=False)
    _vocab: int = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        check_int(self.name, "seq_len", self.seq_len, 1)
        if self.split not in ("train", "eval"):
            raise field_error(f"{self.name}.split", self.split, "'train' or 'eval'")
        if not (isinstance(self.eval_fraction, (int, float)) and 0 < self.eval_fraction < 1):
            raise field_error(f"{self.name}.eval_fraction", self.eval_fraction,
                              "a number in (0, 1)")
        path = Path(self.path)
        if not path.is_file():
            raise field_error(f"{self.name}.path", self.path, "an existing text file")
        size = path.stat().st_size
        if size > MAX_BYTES:
            raise field_error(f"{self.name}.path", self.path,
                              f"a text file of at most {MAX_BYTES >> 30} GiB (it has "
                              f"{size / (1 << 30):.3g} GiB)")
        # the text, its bytes and the int64 ids are all held at once while encoding
        check_memory(f"{self.name}.path: reading {self.path!r} ({size} bytes)",
                     BYTES_PER_CHAR * size)
        text = path.read_text(encoding="utf-8", errors="replace")
        ids, vocab = _encode(text, self.tokenizer, self.name)
        cut = int(round(len(ids) * (1 - self.eval_fraction)))
        part = ids[:cut] if self.split == "train" else ids[cut:]
        if len(part) < self.seq_len + 1:
            raise ConfigError(
                f"{self.name}.path: the {self.split!r} split of {self.path!r} has {len(part)} "
                f"ids, expected at least seq_len + 1 = {self.seq_len + 1}")
        object.__setattr__(self, "_ids", part)
        object.__setattr__(self, "_vocab", vocab)

    @property
    def vocab_size(self) -> int:
        return self._vocab

    @property
    def n_ids(self) -> int:
        """Number of ids in this split."""
        return len(self._ids)

    def sample(self, n: int, generator: torch.Generator) -> Batch:
        starts = torch.randint(0, len(self._ids) - self.seq_len, (n,), generator=generator)
        window = self._ids[starts[:, None] + torch.arange(self.seq_len + 1)]  # (n, T+1)
        return make_batch(window[:, :-1].contiguous(), window[:, 1:].contiguous())


def _encode(text: str, tokenizer: str | None, task: str) -> tuple[Tensor, int]:
    """Ids (N,) long and the vocabulary size."""
    if tokenizer is None:
        data = bytearray(text.encode("utf-8"))
        if not data:
            return torch.zeros(0, dtype=torch.long), 256
        return torch.frombuffer(data, dtype=torch.uint8).long(), 256
    from tokenizers import Tokenizer

    tok_path = Path(tokenizer)
    if tok_path.is_dir():
        tok_path = tok_path / "tokenizer.json"
    if not tok_path.is_file():
        raise field_error(f"{task}.tokenizer", tokenizer,
                          "a local directory holding tokenizer.json (or the file itself)")
    try:
        tok = Tokenizer.from_file(str(tok_path))
    except Exception as e:  # the tokenizers library raises its own exception type
        raise ConfigError(f"{task}.tokenizer: cannot load {str(tok_path)!r}: {e}") from None
    ids = tok.encode(text, add_special_tokens=False).ids
    return torch.tensor(ids, dtype=torch.long), int(tok.get_vocab_size(with_added_tokens=True))
