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

Files are read strictly (``headwise.data.row_files``): JSONL is one JSON object per non-blank
line, lines ending in ``\\n`` only; CSV has a comma-delimited header row naming each field
once and as many values in every row. A repeated key or header name, a missing field, a value
that is not a string, an empty prompt or completion, or a row that is too long is an error
naming the file, the line and the field.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar

import torch

from headwise.data.batch import IGNORE, Batch
from headwise.data.corpus import (
    MAX_BYTES,
    WHOLE,
    check_split,
    deal,
    decode_text,
    local_tokenizer,
)
from headwise.data.row_files import JSON_KINDS, csv_records, jsonl_records, quotable
from headwise.data.task import Task, check_int
from headwise.errors import ConfigError, field_error
from headwise.memory import check_memory

PAD_ID = 0  # padding never reaches a score: attention_mask 0 there and targets IGNORE


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
    _rows: Batch = field(init=False, repr=False, compare=False)
    _vocab: int = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        check_int(self.name, "seq_len", self.seq_len, 1)
        for key in ("prompt", "completion"):
            value = getattr(self, key)
            if not isinstance(value, str) or not value:
                raise field_error(f"{self.name}.{key}", value, "a field name")
        check_split(self.name, self.split, self.eval_fraction)
        ids, vocab = self._encode(read_rows(Path(self.path), (self.prompt, self.completion),
                                            self.name))
        dealt = deal([1] * len(ids), self.eval_fraction)
        keep = [i for i, s in enumerate(dealt)
                if self.split == WHOLE or s == ("train", "eval", "verify").index(self.split)]
        if not keep:
            raise ConfigError(f"{self.name}.path: the {self.split!r} split of {self.path!r} "
                              f"has no rows (rows are dealt whole: {len(ids)} in the file), "
                              "expected at least one")
        check_memory(f"{self.name}.path: {len(keep)} rows of {self.seq_len} ids",
                     64 * len(keep) * self.seq_len)  # Python lists, then tensors
        T = self.seq_len
        tokens, targets, lengths = [], [], []
        for i in keep:
            p, c = ids[i]
            x = p + c  # tokens x[:-1], targets x[1:] from the last prompt token on
            pad = T - (len(x) - 1)
            tokens.append(x[:-1] + [PAD_ID] * pad)
            targets.append([IGNORE] * (len(p) - 1) + c + [IGNORE] * pad)
            lengths.append(len(x) - 1)
        mask = (torch.arange(T) < torch.tensor(lengths)[:, None]).long()  # (R, T)
        rows = Batch(torch.tensor(tokens, dtype=torch.long),
                     torch.tensor(targets, dtype=torch.long), mask,
                     torch.zeros(len(keep), dtype=torch.long))
        object.__setattr__(self, "_rows", rows)
        object.__setattr__(self, "_vocab", vocab)

    def _encode(self, rows: list[tuple[int, tuple[str, str]]]
                ) -> tuple[list[tuple[list[int], list[int]]], int]:
        """Prompt and completion ids of every row, and the vocabulary size."""
        prompts = [r[1][0] for r in rows]
        completions = [r[1][1] for r in rows]
        if self.tokenizer is None:
            p_ids = [list(p.encode()) for p in prompts]
            c_ids = [list(c.encode()) for c in completions]
            vocab = 256
        else:
            tok = local_tokenizer(self.tokenizer, self.name)
            p_ids = [e.ids for e in tok.encode_batch(prompts, add_special_tokens=False)]
            c_ids = [e.ids for e in tok.encode_batch(completions, add_special_tokens=False)]
            vocab = int(tok.get_vocab_size(with_added_tokens=True))
        where = f"{self.name}.path: {self.path}"
        for (line, _), p, c in zip(rows, p_ids, c_ids, strict=True):
            for key, part in ((self.prompt, p), (self.completion, c)):
                if not part:
                    raise ConfigError(f"{where}: line {line}: field {key!r} encodes to no "
                                      "ids, expected a non-empty text")
            if len(p) + len(c) > self.seq_len + 1:
                raise ConfigError(f"{where}: line {line}: prompt + completion have "
                                  f"{len(p) + len(c)} ids, expected at most seq_len + 1 = "
                                  f"{self.seq_len + 1}")
        return list(zip(p_ids, c_ids, strict=True)), vocab

    @property
    def vocab_size(self) -> int:
        return self._vocab

    @property
    def n_rows(self) -> int:
        """Number of rows in this split."""
        return self._rows.size

    def every_example(self, generator: torch.Generator) -> Batch:
        """Every row of this split once, in file order."""
        return self._rows

    def sample(self, n: int, generator: torch.Generator) -> Batch:
        pick = torch.randint(0, self._rows.size, (n,), generator=generator)
        r = self._rows
        assert r.attention_mask is not None
        return Batch(r.tokens[pick], r.targets[pick], r.attention_mask[pick],
                     torch.zeros(n, dtype=torch.long))


def read_rows(path: Path, names: tuple[str, str], task: str
              ) -> list[tuple[int, tuple[str, str]]]:
    """``(line number, (prompt, completion))`` for every row of a JSONL or CSV file
    (``headwise.data.row_files``).

    Raises:
        ConfigError: a missing, too large or non-UTF-8 file, another extension, or a bad row
            (naming the file, the line and the field).
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
    check_memory(f"{task}.path: reading {str(path)!r} ({size} bytes)", 16 * size)
    where = f"{task}.path: {path}"
    quote = quotable(path)
    text = decode_text(path.read_bytes(), where, ConfigError).removeprefix("\ufeff")  # BOM
    records = (jsonl_records(text, where) if suffix == ".jsonl"
               else csv_records(text, where, names, quote))
    rows = []
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
        rows.append((line, (values[0], values[1])))
    if not rows:
        raise ConfigError(f"{where}: no rows, expected at least one")
    return rows
