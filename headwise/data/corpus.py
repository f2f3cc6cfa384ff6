"""Corpus: a local text file read whole, as ids grouped into documents dealt to data splits.

A file is read once and encoded either as its bytes exactly as stored (vocabulary 256, ids =
byte values; no newline translation, no decoding) or with a HuggingFace ``tokenizers``
``tokenizer.json`` from a local path (never downloaded), after strict UTF-8 decoding (invalid
bytes are an error naming their offset; lines are at most ``MAX_LINE_BYTES``). The
tokenizer's own truncation and padding settings are switched off: the whole file is encoded,
with no special tokens.

Documents are the file's blank-line separated paragraphs (a paragraph owns the blank lines
after it); a file with fewer than three paragraphs has one document per line. Each document
is dealt whole to one split (``deal``), so a held-out example never shares text with a
training one. A file of fewer than three lines is cut by position instead.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import torch
from torch import Tensor

from headwise.errors import ConfigError, field_error
from headwise.jsonfile import read_json_object
from headwise.memory import check_memory

if TYPE_CHECKING:
    from tokenizers import Tokenizer

MAX_BYTES = 8 << 30  # corpora beyond a few GiB belong in a streaming pipeline, not in memory
BYTES_PER_CHAR = 24  # peak memory per byte of text while encoding (str, bytes, ids, offsets)
MAX_LINE_BYTES = 1 << 20  # tokenizers take minutes on (or abort for) one line of many MB
MAX_TOKENIZER_BYTES = 64 << 20  # the largest published tokenizer.json is ~35 MB
MAX_ADDED_TOKENS = 100_000  # loading 10**6 added tokens takes minutes
SPLITS = ("train", "eval", "verify")
WHOLE = "all"  # the whole file, as new verification data (``verify --data``)
MIN_DOCUMENTS = 3  # one per split

_PARAGRAPH_END = r"\n(?:[ \t\r\f\v]*\n)+"  # a newline, then one or more blank lines


@dataclass(frozen=True)
class Corpus:
    """A file's ids and how they group into documents.

    Attributes:
        ids: (N,) long, the whole file.
        lengths: (n_docs,) long, ids per document in file order (they sum to N).
        vocab_size: 256 for bytes, else the tokenizer's size with added tokens.
    """

    ids: Tensor
    lengths: Tensor
    vocab_size: int

    def split(self, split: str, eval_fraction: float) -> Tensor:
        """The ids (n,) of one split's documents, in file order.

        Args:
            split: ``"train"``, ``"eval"`` or ``"verify"``, or ``"all"``: every id.
            eval_fraction: share of the ids held out, half for ``"eval"`` and half for
                ``"verify"``.
        """
        if split == WHOLE:
            return self.ids
        k = SPLITS.index(split)
        if len(self.lengths) < MIN_DOCUMENTS:  # too few documents: cut by position
            cut = int(round(len(self.ids) * (1 - eval_fraction)))
            half = cut + (len(self.ids) - cut) // 2
            return self.ids[(0, cut, half)[k]:(cut, half, len(self.ids))[k]]
        owner = torch.tensor(deal(self.lengths.tolist(), eval_fraction), dtype=torch.long)
        return self.ids[owner.repeat_interleave(self.lengths) == k]


def deal(sizes: list[int], eval_fraction: float) -> list[int]:
    """Deal units of the given sizes to splits 0 (train), 1 (eval) and 2 (verify).

    Each unit in order goes to the split furthest below its share (``1 - eval_fraction``,
    ``eval_fraction / 2``, ``eval_fraction / 2``) of the sizes dealt so far, this unit included;
    ties go to the lower split. The held-out units are thus spread through the file, the
    shares match to within one unit, and the result depends only on the sizes.

    Returns:
        The split of each unit.
    """
    dealer = Dealer(eval_fraction)
    return [dealer(size) for size in sizes]


class Dealer:
    """``deal`` one unit at a time: ``dealer(size)`` is the split of the next unit (a unit's
    split depends only on the units before it, so a file can be dealt as it is read)."""

    def __init__(self, eval_fraction: float) -> None:
        self.shares = (1.0 - eval_fraction, eval_fraction / 2, eval_fraction / 2)
        self.dealt = [0, 0, 0]
        self.total = 0

    def __call__(self, size: int) -> int:
        self.total += size
        (s0, s1, s2), dealt, total = self.shares, self.dealt, self.total
        gaps = (s0 * total - dealt[0], s1 * total - dealt[1], s2 * total - dealt[2])
        k = 0 if gaps[0] >= gaps[1] and gaps[0] >= gaps[2] else 1 if gaps[1] >= gaps[2] else 2
        dealt[k] += size
        return k


def check_split(task: str, split: object, eval_fraction: object) -> None:
    """Check a file-backed task's ``split`` and ``eval_fraction`` arguments.

    Raises:
        ConfigError: ``<task>.split`` not one of ``SPLITS``, or ``<task>.eval_fraction`` not
            in (0, 1).
    """
    if split not in (*SPLITS, WHOLE):
        raise field_error(f"{task}.split", split, "'train', 'eval', 'verify' or 'all'")
    if (isinstance(eval_fraction, bool) or not isinstance(eval_fraction, (int, float))
            or not 0 < eval_fraction < 1):
        raise field_error(f"{task}.eval_fraction", eval_fraction, "a number in (0, 1)")


def read_corpus(path: str, tokenizer: str | None, task: str) -> Corpus:
    """Read and encode the whole file ``path``.

    Args:
        path: the text file.
        tokenizer: ``None`` for bytes, or a directory holding ``tokenizer.json`` (or that file).
        task: the task's name, for error messages (``text.path: ...``).

    Raises:
        ConfigError: a missing or too large file, text that is not UTF-8 or has an over-long
            line (with a tokenizer), an unreadable tokenizer, or ids outside its vocabulary.
    """
    file = Path(path)
    if not file.is_file():
        raise field_error(f"{task}.path", path, "an existing text file")
    size = file.stat().st_size
    if size > MAX_BYTES:
        raise field_error(f"{task}.path", path,
                          f"a text file of at most {MAX_BYTES >> 30} GiB (it has "
                          f"{size / (1 << 30):.3g} GiB)")
    # the text, its bytes, the int64 ids and their offsets are all held at once
    check_memory(f"{task}.path: reading {path!r} ({size} bytes)", BYTES_PER_CHAR * size)
    data = file.read_bytes()
    if tokenizer is None:
        ids = torch.frombuffer(bytearray(data), dtype=torch.uint8).long() if data else \
            torch.zeros(0, dtype=torch.long)
        starts = _document_starts(data)
        return Corpus(ids, torch.tensor(starts[1:] + [len(data)]) - torch.tensor(starts), 256)
    text = decode_text(data, f"{task}.path: {path}", ConfigError)
    tok = local_tokenizer(tokenizer, task)
    enc = tok.encode(text, add_special_tokens=False)
    vocab = int(tok.get_vocab_size(with_added_tokens=True))
    if enc.ids and max(enc.ids) >= vocab:
        raise ConfigError(f"{task}.tokenizer: {tokenizer} gives id {max(enc.ids)}, beyond its "
                          f"vocabulary of {vocab}; expected ids 0-{vocab - 1}")
    token_starts = torch.tensor([o[0] for o in enc.offsets], dtype=torch.long)
    # a token belongs to the document its first character is in
    bounds = torch.tensor(_document_starts(text), dtype=torch.long)
    owner = torch.searchsorted(bounds, token_starts, right=True) - 1  # (N,)
    return Corpus(torch.tensor(enc.ids, dtype=torch.long),
                  torch.bincount(owner, minlength=len(bounds)), vocab)


def _document_starts(text: str | bytes) -> list[int]:
    """Offsets (chars, or bytes for ``bytes``) where documents start: paragraphs if there are
    at least ``MIN_DOCUMENTS``, else lines; always at least ``[0]``."""
    ends = [re.compile(_PARAGRAPH_END), re.compile("\n")] if isinstance(text, str) else \
        [re.compile(_PARAGRAPH_END.encode()), re.compile(b"\n")]
    for end in ends:
        starts = [0, *(m.end() for m in end.finditer(text) if m.end() < len(text))]  # type: ignore[arg-type]
        if len(starts) >= MIN_DOCUMENTS:
            return starts
    return starts


def local_tokenizer(tokenizer: str, task: str) -> Tokenizer:
    """The tokenizer at ``tokenizer`` (a directory holding ``tokenizer.json``, or the file),
    with its truncation and padding switched off.

    Raises:
        ConfigError: ``<task>.tokenizer: ...`` for a missing or unreadable tokenizer.
    """
    tok_path = Path(tokenizer)
    if tok_path.is_dir():
        tok_path = tok_path / "tokenizer.json"
    if not tok_path.is_file():
        raise field_error(f"{task}.tokenizer", tokenizer,
                          "a local directory holding tokenizer.json (or the file itself)")
    tok = read_tokenizer(tok_path, ConfigError, f"{task}.tokenizer: ")
    tok.no_truncation()
    tok.no_padding()
    return tok


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
