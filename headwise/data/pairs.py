"""PairsTask: prompt -> completion rows from a local JSONL or CSV file, scored on the completion.

Each row of the file gives a prompt and a completion (two named fields). They are encoded
separately (bytes, or a local ``tokenizer.json`` with no special tokens and its truncation and
padding off) and joined: ``x = prompt + completion``; ``tokens = x[:-1]``, ``targets = x[1:]``
with every target inside the prompt set to ``IGNORE``, so the loss and the metrics read the
completion's tokens only (the last prompt token predicts the first completion token). Rows
shorter than ``seq_len + 1`` ids are right-padded with id 0 (``attention_mask`` 0, targets
``IGNORE``); a longer row is an error naming its line. Rows are dealt whole to the ``"train"``,
``"eval"`` and ``"verify"`` splits (``headwise.data.corpus.deal``, each row one unit), and an
example is a row of its split drawn uniformly.

Files are read strictly and streamed (``headwise.data.row_files``): JSONL is one JSON object
per non-blank line, lines ending in ``\\n`` only; CSV has a comma-delimited header row naming
each field once and as many values in every row. Every row is checked (whatever its split),
rows are dealt as they are read, and a split keeps only its rows' ids, flat (one byte per id
without a tokenizer): memory grows with the split's ids, not with the file's text, and
examples are padded when they are drawn. A repeated key or header name, a missing field, a value
that is not a string, an empty prompt or completion, or a row that is too long is an error
naming the file, the line and the field.
"""

from __future__ import annotations

import json
from array import array
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, ClassVar

import torch
from torch import Tensor

from headwise.data.batch import IGNORE, Batch
from headwise.data.corpus import MAX_BYTES, SPLITS, WHOLE, Dealer, check_split, local_tokenizer
from headwise.data.row_files import JSON_KINDS, csv_records, file_lines, jsonl_records, quotable
from headwise.data.task import Task, check_int
from headwise.errors import ConfigError, field_error
from headwise.memory import check_memory

if TYPE_CHECKING:
    from tokenizers import Tokenizer

PAD_ID = 0  # padding never reaches a score: attention_mask 0 there and targets IGNORE
BYTES_PER_FILE_BYTE = 6  # the most a split's flat ids and row tables take per byte of file
ENCODE_ROWS = 4096  # rows a tokenizer encodes at once (its batch runs on every core)


@dataclass(frozen=True)
class _Rows:
    """A split's rows, flat: ``ids`` (N,) every row's prompt + completion ids in file order
    (uint8 for bytes, int32 for a tokenizer), ``starts`` (R,) where each row begins,
    ``lengths`` (R,) its ids, ``prompts`` (R,) its prompt's ids."""

    ids: Tensor
    starts: Tensor
    lengths: Tensor
    prompts: Tensor

    def batch(self, pick: Tensor, T: int) -> Batch:
        """Rows ``pick`` (n,) as examples (n, T): ``tokens = x[:-1]``, ``targets = x[1:]``
        from the last prompt token on, right-padded (``PAD_ID``, mask 0, ``IGNORE``)."""
        t = torch.arange(T)  # (T,)
        at = self.starts[pick, None] + t  # (n, T) where x[t] is in ids
        last = self.ids.numel() - 1
        real = t < (self.lengths[pick, None] - 1)  # (n, T): x[t] and x[t + 1] both exist
        tokens = torch.where(real, self.ids[at.clamp(max=last)].long(), PAD_ID)
        scored = real & (t >= self.prompts[pick, None] - 1)  # (n, T)
        targets = torch.where(scored, self.ids[(at + 1).clamp(max=last)].long(), IGNORE)
        return Batch(tokens, targets, real.long(), torch.zeros(len(pick), dtype=torch.long))


@dataclass(frozen=True, kw_only=True)
class PairsTask(Task):
    """Completions of prompts read from a file.

    Args:
        path: a ``.jsonl`` or ``.csv`` file (UTF-8).
        prompt: name of the prompt field.
        completion: name of the completion field.
        tokenizer: ``None`` for bytes, or a directory holding ``tokenizer.json`` (or that file).
        seq_len: T; every row must have at most ``seq_len + 1`` ids.
        split: ``"train"``, ``"eval"`` or ``"verify"``.
        eval_fraction: share of the rows held out, split in halves for ``"eval"`` and
            ``"verify"``.

    Raises:
        ConfigError: a missing or malformed file (naming the line and field), a bad split, or
            a split without rows.
    """

    name: ClassVar[str] = "pairs"
    starts_with_bos: ClassVar[bool] = False
    splits: ClassVar[tuple[str, ...]] = ("train", "eval", "verify")
    next_token: ClassVar[bool] = True
    path: str
    prompt: str = "prompt"
    completion: str = "completion"
    tokenizer: str | None = None
    seq_len: int = 64
    split: str = "train"
    eval_fraction: float = 0.1
    _rows: _Rows = field(init=False, repr=False, compare=False)
    _vocab: int = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        check_int(self.name, "seq_len", self.seq_len, 1)
        for key in ("prompt", "completion"):
            value = getattr(self, key)
            if not isinstance(value, str) or not value:
                raise field_error(f"{self.name}.{key}", value, "a field name")
        check_split(self.name, self.split, self.eval_fraction)
        tok = None if self.tokenizer is None else local_tokenizer(self.tokenizer, self.name)
        vocab = 256 if tok is None else int(tok.get_vocab_size(with_added_tokens=True))
        ids = array("B") if tok is None else array("i")
        lengths, prompts = array("i"), array("i")
        dealer = Dealer(self.eval_fraction)
        keep = None if self.split == WHOLE else SPLITS.index(self.split)
        n = 0
        for p, c in self._encoded(read_rows(Path(self.path), (self.prompt, self.completion),
                                            self.name), tok):
            n += 1
            if dealer(1) == keep or keep is None:
                for part in (p, c):
                    ids.frombytes(part) if isinstance(part, bytes) else ids.extend(part)
                lengths.append(len(p) + len(c))
                prompts.append(len(p))
        if not lengths:
            raise ConfigError(f"{self.name}.path: the {self.split!r} split of {self.path!r} "
                              f"has no rows (rows are dealt whole: {n} in the file), "
                              "expected at least one")
        flat = torch.frombuffer(ids, dtype=torch.uint8 if tok is None else torch.int32)
        length = torch.frombuffer(lengths, dtype=torch.int32).long()
        rows = _Rows(flat, torch.cumsum(length, 0) - length, length,
                     torch.frombuffer(prompts, dtype=torch.int32).long())
        object.__setattr__(self, "_rows", rows)
        object.__setattr__(self, "_vocab", vocab)

    def _encoded(self, rows: Iterator[tuple[int, tuple[str, str]]], tok: Tokenizer | None
                 ) -> Iterator[tuple[bytes | list[int], bytes | list[int]]]:
        """Each row's prompt and completion ids, checked (non-empty, at most ``seq_len + 1``
        together); with a tokenizer, encoded ``ENCODE_ROWS`` rows at a time."""
        where = f"{self.name}.path: {self.path}"
        chunk: list[tuple[int, tuple[str, str]]] = []
        for row in rows:
            if tok is None:
                line, (p, c) = row
                yield self._checked(where, line, p.encode(), c.encode())
                continue
            chunk.append(row)
            if len(chunk) == ENCODE_ROWS:
                yield from self._encode_chunk(where, chunk, tok)
                chunk = []
        if chunk and tok is not None:
            yield from self._encode_chunk(where, chunk, tok)

    def _encode_chunk(self, where: str, chunk: list[tuple[int, tuple[str, str]]],
                      tok: Tokenizer) -> Iterator[tuple[bytes | list[int], bytes | list[int]]]:
        p_enc = tok.encode_batch([r[1][0] for r in chunk], add_special_tokens=False)
        c_enc = tok.encode_batch([r[1][1] for r in chunk], add_special_tokens=False)
        for (line, _), p, c in zip(chunk, p_enc, c_enc, strict=True):
            yield self._checked(where, line, p.ids, c.ids)

    def _checked(self, where: str, line: int, p: bytes | list[int], c: bytes | list[int]
                 ) -> tuple[bytes | list[int], bytes | list[int]]:
        for key, part in ((self.prompt, p), (self.completion, c)):
            if not part:
                raise ConfigError(f"{where}: line {line}: field {key!r} encodes to no "
                                  "ids, expected a non-empty text")
        if len(p) + len(c) > self.seq_len + 1:
            raise ConfigError(f"{where}: line {line}: prompt + completion have "
                              f"{len(p) + len(c)} ids, expected at most seq_len + 1 = "
                              f"{self.seq_len + 1}")
        return p, c

    @property
    def vocab_size(self) -> int:
        return self._vocab

    @property
    def n_rows(self) -> int:
        """Number of rows in this split."""
        return int(self._rows.lengths.numel())

    @property
    def n_examples(self) -> int:
        """Every row of this split is one example."""
        return self.n_rows

    def examples_at(self, index: Tensor, generator: torch.Generator) -> Batch:
        """The split's rows at ``index``."""
        return self._rows.batch(index, self.seq_len)

    def sample(self, n: int, generator: torch.Generator) -> Batch:
        pick = torch.randint(0, self.n_rows, (n,), generator=generator)
        return self._rows.batch(pick, self.seq_len)


def read_rows(path: Path, names: tuple[str, str], task: str
              ) -> Iterator[tuple[int, tuple[str, str]]]:
    """``(line number, (prompt, completion))`` for every row of a JSONL or CSV file, streamed
    (``headwise.data.row_files``).

    Raises:
        ConfigError: a missing, too large or non-UTF-8 file, another extension, a bad row
            (naming the file, the line and the field), or no row at all.
    """
    if not path.is_file():
        raise field_error(f"{task}.path", str(path), "an existing .jsonl or .csv file")
    suffix = path.suffix.lower()
    if suffix not in (".jsonl", ".csv"):
        raise field_error(f"{task}.path", str(path), "a file ending in .jsonl or .csv")
    size = path.stat().st_size
    if size > MAX_BYTES:
        raise field_error(f"{task}.path", str(path),
                          f"a file of at most {MAX_BYTES >> 30} GiB")
    check_memory(f"{task}.path: reading {str(path)!r} ({size} bytes)",
                 BYTES_PER_FILE_BYTE * size)
    where = f"{task}.path: {path}"
    quote = quotable(path)
    with path.open("rb") as file:
        lines = file_lines(file, where)
        records = (jsonl_records(lines, where) if suffix == ".jsonl"
                   else csv_records(lines, where, names, quote))
        n = 0
        for line, record in records:
            values = []
            for key in names:
                if key not in record:
                    raise ConfigError(f"{where}: line {line}: field {key!r} missing, expected "
                                      f"fields {list(names)}")
                value = record[key]
                if not isinstance(value, str):
                    kind = JSON_KINDS[type(value)]
                    shown = "" if value is None or not quote else f" ({json.dumps(value)[:40]})"
                    raise ConfigError(f"{where}: line {line}: field {key!r} is {kind}{shown}, "
                                      "expected a string")
                values.append(value)
            n += 1
            yield line, (values[0], values[1])
    if not n:
        raise ConfigError(f"{where}: no rows, expected at least one")
