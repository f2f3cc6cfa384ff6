"""Tokenizers from a local HF directory (``tokenizer.json`` via the ``tokenizers`` package)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import torch
from tokenizers import Tokenizer
from torch import Tensor

from headwise.data.corpus import read_tokenizer
from headwise.errors import CheckpointError


def load_tokenizer(path: str | Path) -> Tokenizer:
    """The fast tokenizer stored as ``tokenizer.json`` in ``path`` (no network access).

    Padding and truncation settings saved in the file are kept; ``encode_batch`` overrides
    padding to the longest sequence.

    Raises:
        CheckpointError: ``tokenizer.json`` missing, unreadable, or beyond the bounds of
            ``headwise.data.corpus.read_tokenizer``.
    """
    file = Path(path) / "tokenizer.json"
    if not file.is_file():
        raise CheckpointError(f"{file}: file not found (headwise reads tokenizers only from "
                              "tokenizer.json)")
    return read_tokenizer(file, CheckpointError)


def encode_batch(tokenizer: Tokenizer, texts: Sequence[str], max_len: int | None = None,
                 pad_id: int | None = None) -> tuple[Tensor, Tensor]:
    """Tokenise ``texts`` and pad them on the right to the longest.

    Args:
        tokenizer: from ``load_tokenizer`` (its post-processor adds special tokens).
        texts: the strings.
        max_len: truncate each sequence to this many tokens (``None``: no truncation).
        pad_id: padding id; default the tokenizer's own padding id, else 0.

    Returns:
        ``tokens`` (B, T) long and ``attention_mask`` (B, T) long, 1 for real tokens.

    Raises:
        ValueError: an empty list of texts.
    """
    if not texts:
        raise ValueError("texts: got an empty list, expected at least one string")
    if pad_id is None:
        padding = tokenizer.padding
        pad_id = int(padding["pad_id"]) if padding else 0
    ids = [enc.ids for enc in _without_padding(tokenizer).encode_batch(list(texts))]
    if max_len is not None:
        ids = [seq[:max_len] for seq in ids]
    T = max(len(seq) for seq in ids)
    tokens = torch.full((len(ids), T), pad_id, dtype=torch.long)
    mask = torch.zeros(len(ids), T, dtype=torch.long)
    for row, seq in enumerate(ids):
        tokens[row, : len(seq)] = torch.tensor(seq, dtype=torch.long)
        mask[row, : len(seq)] = 1
    return tokens, mask


def _without_padding(tokenizer: Tokenizer) -> Tokenizer:
    clone = Tokenizer.from_str(tokenizer.to_str())
    clone.no_padding()
    clone.no_truncation()
    return clone
