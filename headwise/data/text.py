"""TextTask: next-token language modelling on a local text file (bytes or a local tokenizer).

The file is read once and encoded either as its bytes exactly as stored (vocabulary 256, ids =
byte values; no newline translation, no decoding) or with a HuggingFace ``tokenizers``
``tokenizer.json`` from a local path (never downloaded), after strict UTF-8 decoding (invalid
bytes are an error naming their offset; lines are at most ``MAX_LINE_BYTES``). The
first ``1 - eval_fraction`` of the ids form the ``"train"`` split; the rest is held out, its
first half the ``"eval"`` split (the enforcement set) and its second half the ``"verify"`` split
(the verification set), so neither held-out set sees training text or the other's. An
example is a window of ``seq_len + 1`` consecutive ids at a uniformly random start:
``tokens = w[:-1]``, ``targets = w[1:]`` (every position scored). Text tasks do not use the
synthetic tasks' special ids; mixing them with synthetic tasks needs a model vocabulary
covering both.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, ClassVar

import torch
from torch import Tensor

from headwise.data.batch import Batch
from headwise.data.task import Task, check_int, make_batch
from headwise.errors import ConfigError, field_error
from headwise.jsonfile import read_json_object
from headwise.memory import check_memory

if TYPE_CHECKING:
    from tokenizers import Tokenizer

MAX_BYTES = 8 << 30  # corpora beyond a few GiB belong in a streaming pipeline, not in memory
BYTES_PER_CHAR = 16  # peak memory per byte of text while encoding (str, bytes, int64 ids)
MAX_LINE_BYTES = 1 << 20  # tokenizers take minutes on (or abort for) one line of many MB
MAX_TOKENIZER_BYTES = 64 << 20  # the largest published tokenizer.json is ~35 MB
MAX_ADDED_TOKENS = 100_000  # loading 10**6 added tokens takes minutes


@dataclass(frozen=True, kw_only=True)
class TextTask(Task):
    """Language modelling over a local text file.

    Args:
        path: the text file (UTF-8).
        seq_len: T.
        tokenizer: ``None`` for bytes, or a directory holding ``tokenizer.json`` (or that file).
        split: ``"train"``, ``"eval"`` or ``"verify"``.
        eval_fraction: share of the ids (at the end of the file) held out, split in halves
            for ``"eval"`` and ``"verify"``.

    Raises:
        ConfigError: a missing file or tokenizer, a bad split, or a split shorter than
            ``seq_len + 1`` ids.
    """

    name: ClassVar[str] = "text"
    starts_with_bos: ClassVar[bool] = False
    splits: ClassVar[tuple[str, ...]] = ("train", "eval", "verify")
    path: str
    seq_len: int = 64
    tokenizer: str | None = None
    split: str = "train"
    eval_fraction: float = 0.1
    _ids: Tensor = field(init=False, repr=False, compare=False)
    _vocab: int = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        check_int(self.name, "seq_len", self.seq_len, 1)
        if self.split not in self.splits:
            raise field_error(f"{self.name}.split", self.split, "'train', 'eval' or 'verify'")
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
        ids, vocab = _encode(path, self.tokenizer, self.name)
        cut = int(round(len(ids) * (1 - self.eval_fraction)))
        half = cut + (len(ids) - cut) // 2
        part = {"train": ids[:cut], "eval": ids[cut:half], "verify": ids[half:]}[self.split]
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


def _encode(path: Path, tokenizer: str | None, task: str) -> tuple[Tensor, int]:
    """Ids (N,) long and the vocabulary size.

    Raises:
        ConfigError: text that is not UTF-8 or has an over-long line (with a tokenizer), an
            unreadable tokenizer, or ids outside the tokenizer's vocabulary.
    """
    if tokenizer is None:
        data = bytearray(path.read_bytes())
        if not data:
            return torch.zeros(0, dtype=torch.long), 256
        return torch.frombuffer(data, dtype=torch.uint8).long(), 256
    text = decode_text(path.read_bytes(), f"{task}.path: {path}", ConfigError)
    tok_path = Path(tokenizer)
    if tok_path.is_dir():
        tok_path = tok_path / "tokenizer.json"
    if not tok_path.is_file():
        raise field_error(f"{task}.tokenizer", tokenizer,
                          "a local directory holding tokenizer.json (or the file itself)")
    tok = read_tokenizer(tok_path, ConfigError, f"{task}.tokenizer: ")
    ids = tok.encode(text, add_special_tokens=False).ids
    vocab = int(tok.get_vocab_size(with_added_tokens=True))
    if ids and max(ids) >= vocab:
        raise ConfigError(f"{task}.tokenizer: {tok_path} gives id {max(ids)}, beyond its "
                          f"vocabulary of {vocab}; expected ids 0-{vocab - 1}")
    return torch.tensor(ids, dtype=torch.long), vocab


def decode_text(data: bytes, source: str, error: type[Exception]) -> str:
    """``data`` decoded as UTF-8 exactly (line endings kept), every line checked.

    Raises:
        error: invalid UTF-8 (naming the byte offset) or a line over ``MAX_LINE_BYTES``, the
            message starting with ``source``.
    """
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise error(f"{source}: not UTF-8 text (byte {e.start} is {data[e.start]:#04x}); "
                    "expected UTF-8") from None
    start, line = 0, 1
    while start < len(data):
        end = data.find(b"\n", start)
        end = len(data) if end < 0 else end
        if end - start > MAX_LINE_BYTES:
            raise error(f"{source}: line {line} has {end - start} bytes, expected at most "
                        f"{MAX_LINE_BYTES} per line")
        start, line = end + 1, line + 1
    return text


def read_tokenizer(path: Path, error: type[Exception], prefix: str = "") -> Tokenizer:
    """The fast tokenizer in the ``tokenizer.json`` file ``path``, bounded before parsing:
    at most ``MAX_TOKENIZER_BYTES`` and ``MAX_ADDED_TOKENS`` added tokens.

    Raises:
        error: an unreadable, too large or malformed file, ``prefix`` + the file first.
    """
    from tokenizers import Tokenizer

    data = read_json_object(path, lambda m: error(prefix + m), MAX_TOKENIZER_BYTES)
    added = data.get("added_tokens") or []
    if not isinstance(added, list) or len(added) > MAX_ADDED_TOKENS:
        raise error(f"{prefix}{path}: added_tokens: expected a list of at most "
                    f"{MAX_ADDED_TOKENS} tokens")
    try:
        return Tokenizer.from_str(json.dumps(data))
    except Exception as e:  # the tokenizers library raises its own exception type
        raise error(f"{prefix}{path}: cannot read tokenizer ({str(e)[:200]})") from None
